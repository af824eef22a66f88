// A tile's block of 5-bit codes (`tile_layout.h`, kQ5Bytes) unpacked in registers into its eight vectors
// of 5-bit values 0..31 in the int8 codes' order, so the kernels that read int8 tiles read these with the
// same arithmetic after the load (AVX2 builds; the plain C++ paths take `q5_value`).
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "tile_layout.h"

namespace specexec_q5 {

// byte p: 0x10 where bit p of word is set, else 0
inline __m256i high_bits(uint32_t word) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  return _mm256_maskz_mov_epi8(word, _mm256_set1_epi8(0x10));
#else
  // byte p takes the word's byte p / 8 (the shuffle reads within each 128-bit half, both holding the
  // word four times), then keeps its bit p % 8
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int32_t>(word)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));  // 1 << (p % 8)
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
#endif
}

// the block's 8 vectors of values 0..31
inline void load_values(const uint8_t* block, __m256i* v) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  uint32_t words[8];
  std::memcpy(words, block + specexec_tiles::kQ5HighBits, sizeof(words));
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * c));
    v[c] = _mm256_or_si256(_mm256_and_si256(packed, low), high_bits(words[c]));
    v[c + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(packed, 4), low), high_bits(words[c + 4]));
  }
}

}  // namespace specexec_q5
#endif
