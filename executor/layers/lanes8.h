// Eight float lanes of AVX2 (with FMA and F16C): loads that widen bfloat16 (its bits shifted up) and
// float16 to float exactly, and the largest lane. The attention vectors' AVX2 width
// (`attention_vectors.h`) is made of them, and int8_dot's activation quantization
// (`quantized/quantized_dot_cpu.cpp`), which works 8 lanes at a time on every vector build, uses them.
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

namespace specexec_lanes8 {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
inline __m256 load8(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

inline float max_lanes8(__m256 a) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

}  // namespace specexec_lanes8
#endif
