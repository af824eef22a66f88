// The CPU's bfloat16 dot product (AVX512_BF16's vdpbf16ps) for the attention kernel's bfloat16 pools
// (`paged_attention_cpu.cpp`): the scores of W keys against a query row, and the probability-weighted sum
// of value rows two keys a step. W_HAS_BF16_DOT is 1 where the build machine has the instruction.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention_vectors.h"

namespace specexec_attention {

#if defined(__AVX512BF16__)
// 16 rows of 16 dwords -> 16 columns: out[e] = (rows[0][e], ..., rows[15][e]). Pairs of dwords, then of
// qwords, interleave within 128-bit lanes (4 rows' element e in lane e / 4); a 4x4 transpose of lanes
// across the four row groups finishes it. 64 shuffles.
inline void transpose_16x16_dwords(const __m512i* rows, __m512i* out) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // u[4g + k], lane L: rows 4g..4g+3 at element 4L + k
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i s0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44), s1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xEE);
    const __m512i s2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44), s3 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xEE);
    out[k] = _mm512_shuffle_i32x4(s0, s2, 0x88);
    out[4 + k] = _mm512_shuffle_i32x4(s0, s2, 0xDD);
    out[8 + k] = _mm512_shuffle_i32x4(s1, s3, 0x88);
    out[12 + k] = _mm512_shuffle_i32x4(s1, s3, 0xDD);
  }
}

// The scores of W bfloat16 keys (at `slots`, this KV head) against R bfloat16 query rows (D each,
// unscaled), on the CPU's bfloat16 dot product (vdpbf16ps: pairs of products, exact in float, added to
// float sums), times `scale`: dots[r * stride + j]. The keys are read straight from the pool (no
// conversion to float) and transposed once into vectors of one bfloat16 pair of every key (D / 2 of
// them, 2 x 64 shuffles for D = 64), so each row's dots are D / 2 dot products with its pair broadcast
// and the W keys in the lanes: no sum across lanes, and every row summed in the same order whatever the
// number of rows (a verify row's scores are its decode's, bit for bit). Keys past `width` count as
// zeros (their slots are not read).
template <int64_t D>
inline void key_dots_bf16(const c10::BFloat16* query, int64_t R, const c10::BFloat16* khead, const int64_t* slots,
                          int64_t width, int64_t slot_stride, float scale, float* dots, int64_t stride) {
  static_assert(D % 32 == 0);
  constexpr int64_t P = D / 2;  // bfloat16 pairs a key
  static const c10::BFloat16 zeros[D] = {};
  __m512i kt[P];  // kt[i]: pair i of the W keys
  for (int64_t b = 0; b < P; b += 16) {
    __m512i keys[16];  // pairs [b, b + 16) of each key
    for (int64_t j = 0; j < W; ++j) {
      const c10::BFloat16* key = j < width ? khead + slots[j] * slot_stride : zeros;
      keys[j] = _mm512_loadu_si512(key + 2 * b);
    }
    transpose_16x16_dwords(keys, kt + b);
  }
  const vf vscale = vset(scale);
  const auto* qpairs = reinterpret_cast<const int32_t*>(query);  // row r's pair i at r * P + i
  in_row_blocks<4>(R, [&](auto rows, int64_t r0) {
    constexpr int64_t N = decltype(rows)::value;
    vf even[N], odd[N];  // two sums a row (even and odd pairs), so the multiply-adds overlap
    for (int64_t r = 0; r < N; ++r) even[r] = odd[r] = vzero();
#pragma GCC unroll 8
    for (int64_t i = 0; i < P; i += 2) {
      for (int64_t r = 0; r < N; ++r) {
        const int32_t* q = qpairs + (r0 + r) * P + i;
        even[r] = _mm512_dpbf16_ps(even[r], (__m512bh)_mm512_set1_epi32(q[0]), (__m512bh)kt[i]);
        odd[r] = _mm512_dpbf16_ps(odd[r], (__m512bh)_mm512_set1_epi32(q[1]), (__m512bh)kt[i + 1]);
      }
    }
    for (int64_t r = 0; r < N; ++r) vstore(dots + (r0 + r) * stride, vmul(vadd(even[r], odd[r]), vscale));
  });
}
#define W_HAS_BF16_DOT 1
#else
#define W_HAS_BF16_DOT 0
#endif

#if W_HAS_BF16_DOT
// acc[r, :] = sum_k p[r, k] V[k, :] for ROWS rows on the bfloat16 dot product, two keys a step: the V rows
// of keys k and k + 1 interleaved (a's and b's elements alternating, per 128-bit lane) and each row's
// (p[k], p[k + 1]) as a bfloat16 pair, so one vdpbf16ps adds both keys' terms for 16 elements. `pairs`:
// the rows' probabilities as bfloat16 pairs, rows `pstride` pairs apart. The interleave leaves each sum's
// lanes in the order d = 8L + i (low half) and 8L + 4 + i (high half), i < 4, per 32 elements; they are
// put back in order at the end.
template <int64_t D, int64_t ROWS>
inline void weighted_values_bf16_rows(const c10::BFloat16* vhead, int64_t slot_stride, const int64_t* slots,
                                      int64_t keys, const uint32_t* pairs, int64_t pstride, float* acc) {
  constexpr int64_t C = D / 32;
  static const c10::BFloat16 zeros[D] = {};  // the partner of an odd last key (its p is 0)
  vf lo[ROWS][C], hi[ROWS][C];
  for (int64_t j = 0; j < ROWS; ++j) {
    for (int64_t c = 0; c < C; ++c) lo[j][c] = hi[j][c] = vzero();
  }
  for (int64_t k = 0; k < keys; k += 2) {
    const auto* a = reinterpret_cast<const __m512i*>(vhead + slots[k] * slot_stride);
    const auto* b = reinterpret_cast<const __m512i*>(k + 1 < keys ? vhead + slots[k + 1] * slot_stride : zeros);
    __m512bh vlo[C], vhi[C];
    for (int64_t c = 0; c < C; ++c) {
      const __m512i x = _mm512_loadu_si512(a + c), y = _mm512_loadu_si512(b + c);
      vlo[c] = (__m512bh)_mm512_unpacklo_epi16(x, y);
      vhi[c] = (__m512bh)_mm512_unpackhi_epi16(x, y);
    }
    for (int64_t j = 0; j < ROWS; ++j) {
      const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(pairs[j * pstride + k / 2]));
      for (int64_t c = 0; c < C; ++c) {
        lo[j][c] = _mm512_dpbf16_ps(lo[j][c], w, vlo[c]);
        hi[j][c] = _mm512_dpbf16_ps(hi[j][c], w, vhi[c]);
      }
    }
  }
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int64_t j = 0; j < ROWS; ++j) {
    for (int64_t c = 0; c < C; ++c) {
      vstore(acc + j * D + c * 32, _mm512_permutex2var_ps(lo[j][c], first, hi[j][c]));
      vstore(acc + j * D + c * 32 + 16, _mm512_permutex2var_ps(lo[j][c], second, hi[j][c]));
    }
  }
}

// the same for R rows, MAX_ROWS at a time
template <int64_t D, int64_t MAX_ROWS>
inline void weighted_values_bf16(const c10::BFloat16* vhead, int64_t slot_stride, const int64_t* slots, int64_t keys,
                                 const uint32_t* pairs, int64_t pstride, int64_t R, float* acc) {
  in_row_blocks<MAX_ROWS>(R, [&](auto rows, int64_t r0) {
    weighted_values_bf16_rows<D, decltype(rows)::value>(vhead, slot_stride, slots, keys, pairs + r0 * pstride,
                                                        pstride, acc + r0 * D);
  });
}
#endif

}  // namespace specexec_attention
