// The layout of int8_dot's weight tiles, shared by the kernels that read them (`quantized_dot_cpu.cpp`,
// `q8_dequantize_cpu.cpp`) and written by `pack_q4`, `pack_q8`, `pack_q5` and `tile_block_scales` in
// quantized_dot.py.
#pragma once

#include <cstdint>

namespace specexec_tiles {

constexpr int64_t kBlock = 32;  // inputs per activation scale (and per Q4 scale)
constexpr int64_t kHalfBlock = 16;  // inputs per weight scale of int8 codes with half-block scales (Q6_K)
constexpr int64_t kTile = 8;  // weight rows a tile interleaves
constexpr int64_t kQ4Bytes = 160;  // a tile's block of Q4: 128 bytes of codes, 8 float16 scales, 8 offsets
constexpr int64_t kQ8Bytes = 256;  // a tile's block of int8 codes: vector c's byte 4i + j is row i's input 4c + j
// A tile's block of 5-bit codes (GGUF's Q5_0, Q5_1, Q5_K), the int8 codes' vectors at 5 bits each: four
// 32-byte vectors whose low nibbles hold the low 4 bits of vectors 0..3 and whose high nibbles those of
// vectors 4..7, then eight 32-bit words, word c's bit p holding bit 4 of vector c's byte p. The 5-bit
// value v is the code v - 16 where the layer has no offsets (Q5_0), v itself where it has (Q5_1, Q5_K).
constexpr int64_t kQ5Bytes = 160;
constexpr int64_t kQ5HighBits = 128;  // where the words start
constexpr int kQ5Centre = 16;  // what a layer without offsets takes off the 5-bit value

// the 5-bit value of vector c's byte p in the block (the plain C++ paths)
inline int q5_value(const uint8_t* block, int64_t c, int64_t p) {
  const uint8_t packed = block[32 * (c % 4) + p];
  const uint8_t word_byte = block[kQ5HighBits + 4 * c + p / 8];  // little-endian words
  return (c < 4 ? packed & 0x0F : packed >> 4) | (((word_byte >> (p % 8)) & 1) << 4);
}

// the int8 code of vector c's byte p in a tile's block of int8 codes, or of 5-bit codes (`five`: its
// value less `centre`) (the plain C++ paths)
inline int block_code(const uint8_t* block, bool five, int centre, int64_t c, int64_t p) {
  return five ? q5_value(block, c, p) - centre : reinterpret_cast<const int8_t*>(block)[32 * c + p];
}

}  // namespace specexec_tiles
