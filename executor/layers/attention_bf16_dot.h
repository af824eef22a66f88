// The CPU's bfloat16 dot product (AVX512_BF16's vdpbf16ps) for the attention kernel's bfloat16 pools
// (`paged_attention_cpu.cpp`): the scores of W keys against a query row, and the probability-weighted sum
// of value rows two keys a step. W_HAS_BF16_DOT is 1 where the build machine has the instruction.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention_vectors.h"

namespace specexec_attention {

#if defined(__AVX512BF16__)
// The same dots for bfloat16 keys and queries, on the CPU's bfloat16 dot product (vdpbf16ps: pairs of
// products, exact in float, added to float sums), read straight from the pool: no conversion of K to
// float, half the multiply-adds. query: R rows of D bfloat16, unscaled; the dots come out times `scale`.
// Keys past `width` count as zeros (their slots are not read).
template <int64_t D>
inline void key_dots_bf16(const c10::BFloat16* query, int64_t R, const c10::BFloat16* khead, const int64_t* slots,
                          int64_t width, int64_t slot_stride, float scale, float* dots, int64_t stride) {
  static_assert(D % 32 == 0);
  constexpr int64_t C = D / 32;
  const __m512i* krows[W];
  static const c10::BFloat16 zeros[D] = {};
  for (int64_t j = 0; j < W; ++j) {
    krows[j] = reinterpret_cast<const __m512i*>(j < width ? khead + slots[j] * slot_stride : zeros);
  }
  const vf vscale = vset(scale);
  for (int64_t r = 0; r < R; ++r) {
    __m512bh q[C];
    for (int64_t c = 0; c < C; ++c) q[c] = (__m512bh)_mm512_loadu_si512(query + r * D + c * 32);
    vf sums[W];
#pragma GCC unroll 16
    for (int64_t j = 0; j < W; ++j) {
      vf s = _mm512_dpbf16_ps(vzero(), q[0], (__m512bh)_mm512_loadu_si512(krows[j]));
#pragma GCC unroll 4
      for (int64_t c = 1; c < C; ++c) s = _mm512_dpbf16_ps(s, q[c], (__m512bh)_mm512_loadu_si512(krows[j] + c));
      sums[j] = s;
    }
    vstore(dots + r * stride, vmul(transposed_sums(sums), vscale));
  }
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
