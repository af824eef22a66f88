// Float vectors of the build machine's width for the CPU attention kernel (`paged_attention_cpu.cpp`):
// AVX-512 (16 lanes) or AVX2 + FMA + F16C (8 lanes), whichever -march=native gives, with loads that widen
// bfloat16 and float16 to float, e^x for the softmax and the transposing sum of W vectors. W_HAS_VECTORS
// is 0 (and W 0) where the build machine has neither: the plain loops run there.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "lanes8.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#include <immintrin.h>
#define W_HAS_VECTORS 1
#else
#define W_HAS_VECTORS 0
#endif

namespace specexec_attention {

// ---- float vectors of the build machine's width -------------------------------------------------------
#if defined(__AVX512F__)
constexpr int64_t W = 16;
using vf = __m512;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset(float x) { return _mm512_set1_ps(x); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline vf vload(const c10::BFloat16* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
inline vf vload(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(vf a) { return _mm512_reduce_add_ps(a); }
inline float vmax_lanes(vf a) { return _mm512_reduce_max_ps(a); }
inline void vstore(float* p, vf a) { _mm512_storeu_ps(p, a); }
inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vround(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vf vpow2i(vf n) {  // 2^n for integral n in float range
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
constexpr int64_t W = 8;
using vf = __m256;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vset(float x) { return _mm256_set1_ps(x); }
inline vf vload(const float* p) { return specexec_lanes8::load8(p); }
inline vf vload(const c10::BFloat16* p) { return specexec_lanes8::load8(p); }
inline vf vload(const c10::Half* p) { return specexec_lanes8::load8(p); }
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(vf a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline void vstore(float* p, vf a) { _mm256_storeu_ps(p, a); }
inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
inline float vmax_lanes(vf a) { return specexec_lanes8::max_lanes8(a); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf vround(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vf vpow2i(vf n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
#else
constexpr int64_t W = 0;  // no vector path: the plain loops run
#endif

#if W_HAS_VECTORS
// e^x for x <= 0 (softmax's x - max), to about 2 ulp: e^x = 2^n * e^r with n = round(x / ln 2) and
// r = x - n ln 2 (in two parts), e^r by its degree-6 Taylor polynomial (|r| <= ln 2 / 2). A NaN stays
// NaN, as torch's softmax keeps it, so that a NaN score fails its request instead of weighing ~0.
inline vf vexp(vf x) {
  // below -87.3: 0 (2^n would leave float's range). maxps returns its second operand where either is NaN:
  // x second, so a NaN x passes through (vmax(x, -87.3) made it -87.3)
  x = vmax(vset(-87.3f), x);
  const vf n = vround(vmul(x, vset(1.44269504088896341f)));
  const vf r = vfma(n, vset(-1.42860677e-6f), vfma(n, vset(-0.693145752f), x));
  vf p = vset(1.f / 720);
  p = vfma(p, r, vset(1.f / 120));
  p = vfma(p, r, vset(1.f / 24));
  p = vfma(p, r, vset(1.f / 6));
  p = vfma(p, r, vset(0.5f));
  p = vfma(p, r, vset(1.f));
  p = vfma(p, r, vset(1.f));
  return vmul(p, vpow2i(n));
}
#endif

#if W_HAS_VECTORS
// lane j of the result = the sum of s[j]'s lanes (W vectors in): a transposing sum, about three vector
// ops a key where a horizontal sum per key takes eight
#if defined(__AVX512F__)
inline vf transposed_sums(const vf* s) {
  vf pairs[8], quads[4];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: [s2i lanes 0+2, s2i+1 lanes 0+2, s2i 1+3, s2i+1 1+3]
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(s[2 * i], s[2 * i + 1]), _mm512_unpackhi_ps(s[2 * i], s[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: keys 4i..4i+3, that lane's share
    const __m512d x = _mm512_castps_pd(pairs[2 * i]), y = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const vf low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x44), _mm512_shuffle_f32x4(quads[0], quads[1], 0xEE));
  const vf high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x44), _mm512_shuffle_f32x4(quads[2], quads[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88), _mm512_shuffle_f32x4(low, high, 0xDD));
}
#else
inline vf transposed_sums(const vf* s) {
  const vf a0 = _mm256_hadd_ps(s[0], s[1]), a1 = _mm256_hadd_ps(s[2], s[3]);
  const vf a2 = _mm256_hadd_ps(s[4], s[5]), a3 = _mm256_hadd_ps(s[6], s[7]);
  const vf b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);  // per 128-bit half: keys 0-3, 4-7
  return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}
#endif
#endif

// f(rows, r0) for the blocks of R rows, MAX_ROWS at a time, rows an std::integral_constant (the block's
// size): runs a kernel whose row count is known at compile time (its sums kept in registers) over any R
template <int64_t MAX_ROWS, typename F>
inline void in_row_blocks(int64_t R, F&& f) {
  static_assert(MAX_ROWS >= 1 && MAX_ROWS <= 6);
  for (int64_t r0 = 0; r0 < R; r0 += MAX_ROWS) {
    switch (std::min<int64_t>(MAX_ROWS, R - r0)) {
      case 1: f(std::integral_constant<int64_t, 1>{}, r0); break;
      case 2: f(std::integral_constant<int64_t, std::min<int64_t>(2, MAX_ROWS)>{}, r0); break;
      case 3: f(std::integral_constant<int64_t, std::min<int64_t>(3, MAX_ROWS)>{}, r0); break;
      case 4: f(std::integral_constant<int64_t, std::min<int64_t>(4, MAX_ROWS)>{}, r0); break;
      case 5: f(std::integral_constant<int64_t, std::min<int64_t>(5, MAX_ROWS)>{}, r0); break;
      default: f(std::integral_constant<int64_t, MAX_ROWS>{}, r0); break;
    }
  }
}

}  // namespace specexec_attention
