// The layout of int8_dot's weight tiles, shared by the kernels that read them (`quantized_dot_cpu.cpp`,
// `q8_dequantize_cpu.cpp`) and written by `pack_q4`, `pack_q8` and `tile_block_scales` in quantized_dot.py.
#pragma once

#include <cstdint>

namespace specexec_tiles {

constexpr int64_t kBlock = 32;  // inputs per activation scale (and per Q4 scale)
constexpr int64_t kHalfBlock = 16;  // inputs per weight scale of int8 codes with half-block scales (Q6_K)
constexpr int64_t kTile = 8;  // weight rows a tile interleaves
constexpr int64_t kQ4Bytes = 160;  // a tile's block of Q4: 128 bytes of codes, 8 float16 scales, 8 offsets
constexpr int64_t kQ8Bytes = 256;  // a tile's block of int8 codes: vector c's byte 4i + j is row i's input 4c + j

}  // namespace specexec_tiles
