// Weight-only quantized matmuls for few rows (decode and verify) with integer dot products, llama.cpp's
// way: each activation row is quantized to int8 in blocks of 32 (one float scale per block, the block's
// absolute maximum over 127, round to nearest), and every block's dot with the weights is an integer
// dot product (AVX512-VNNI or AVX-VNNI `dpbusd`, else AVX2 `maddubs` + `madd`, else plain C++), scaled
// once per block in float.
//
// The weights come in tiles of 8 output rows interleaved (llama.cpp's "repacked" layouts): for each block
// of 32 inputs, 32-byte vector c of a tile holds inputs 4c..4c+3 of each of its 8 rows (row i in bytes
// 4i..4i+3), so one `dpbusd` against 4 activation bytes broadcast gives 8 rows' partial sums at once and
// a block's float work (convert, scale, accumulate) is one vector op for 8 rows, not 8 horizontal sums.
// A tile's blocks follow each other; the tiles follow each other (`pack_q4`, `pack_q8` in
// quantized_dot.py). Each tile is read once for every 4 activation rows. AVX-512 builds take two tiles a
// pass in 512-bit vectors from 16 activation rows on (prefill chunks, large verify batches), so each
// broadcast activation group feeds 16 weight rows and a block's loads per row halve, with the same
// results (one EPYC core, a 3072x576 Q4 layer in cache: 1.3-1.4x at 32 to 512 rows; see `kPairRows`).
//
// - q4_linear: 4-bit codes q in 0..15 with a float16 scale d and offset m per block of 32 inputs (weight
//   = q * d + m: GGUF's Q4_1 and specexec's int4). Per block: d * xd * sum(q * xq) + m * xd * sum(xq).
//   A tile's block is 160 bytes: four 32-byte vectors whose low nibbles hold vectors 0..3 and high
//   nibbles vectors 4..7, then the 8 rows' scales and their offsets in float16 (Q4_1's 20 bytes a row).
// - q8_linear: int8 codes, -128..127 (specexec's int8 uses -127..127; GGUF's Q8_0 may hold -128), with a
//   float scale per output row (specexec's int8), per block of 32 inputs (GGUF's Q8_0, tiled as the
//   codes: 8 floats a tile's block, in float32 or, where float16 holds them exactly as it holds Q8_0's
//   and Q5_0's d, in float16: half the bytes, widened in registers), or per 16 inputs (GGUF's Q6_K:
//   16 floats a tile's block). A tile's block is 256 bytes. With an offset per block of 32 (weight =
//   code * scale + offset: GGUF's Q5_1 and Q5_K, codes 0..31, and 4-bit codes fused with int8-block
//   types) each block's offset term m * xd * sum(xq) is added after the dots, as q4_linear adds Q4_1's.
//   With VNNI each code is taken as
//   the unsigned byte w + 128 (`dpbusd` multiplies unsigned by signed) and 128 * sum(xq) is subtracted,
//   in integers; on AVX2 by the sign trick (|w| as unsigned times xq carrying w's sign), so no product
//   pair overflows `maddubs`'s 16-bit sums. Codes of 5 bits (GGUF's Q5_0, Q5_1, Q5_K) come in 5-bit tiles
//   (uint8: `tile_layout.h`, 160 bytes a tile's block instead of 256), unpacked in registers into the
//   vectors an int8 tile's load gives (`q5_values.h`), so the arithmetic after the load is the same and
//   so are the results, bit for bit; a decode step reads 0.6x the bytes for them.
//
// The only rounding beyond the float path's is the activations' int8 step: |error| of a block's dot <=
// sum(|w|) * xd / 2. A block of x holding NaN or Inf makes its row's outputs NaN, as torch's product
// spoils that row (the int8 step would have rounded it to a plausible code). Weight tiles are split over torch's threads; x in float32, bfloat16 or float16, the
// output in x's dtype; a row's result never depends on the other rows of the call.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "../float_convert.h"
#include "../lanes8.h"
#include "q5_values.h"
#include "tile_layout.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SPECEXEC_SIMD 1
#include <immintrin.h>
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define SPECEXEC_VNNI 1  // dpbusd: no 16-bit pair sums to overflow
#endif
#endif

namespace {

using namespace specexec_tiles;

constexpr int64_t kRowTile = 4;  // activation rows one pass over a tile serves

// Activation rows as int8 blocks: xq [M, K], xd [M, K / 32] (scale), xs [M, K / 32] (xd * sum(xq)),
// sums [M, K / 32] (sum(xq)), half_sums [M, K / 16] (sum(xq) over each 16 inputs: for weights with a scale
// per 16, GGUF's Q6_K).
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> scale, scaled_sum;
  std::vector<int32_t> sum, half_sum;
};

#if defined(SPECEXEC_SIMD)
using specexec_lanes8::load8;

inline int32_t sum_lanes(__m256i a) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// One block of 32 values as the scalar loop below quantizes it, 8 lanes at a time, with the same float
// operations in the same order (cvtps rounds to nearest-even as nearbyint does): the same codes and
// scales bit for bit. Returns false where the block holds NaN or Inf (the caller spoils the row).
template <typename T>
inline bool quantize_block(const T* xb, int8_t* qb, float& d, int32_t halves[2]) {
  __m256 v[4], amax = _mm256_setzero_ps(), spoiled = _mm256_setzero_ps();
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    v[c] = load8(xb + 8 * c);
    amax = _mm256_max_ps(amax, _mm256_and_ps(v[c], magnitude));
    spoiled = _mm256_add_ps(spoiled, _mm256_mul_ps(v[c], _mm256_setzero_ps()));  // NaN from NaN or Inf
  }
  if (_mm256_movemask_ps(_mm256_cmp_ps(spoiled, _mm256_setzero_ps(), _CMP_NEQ_UQ)) != 0) return false;
  const float top = specexec_lanes8::max_lanes8(amax);
  d = top / 127.f;
  const __m256 inv = _mm256_set1_ps(top > 0.f ? 127.f / top : 0.f);
  __m256i q[4];
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    q[c] = _mm256_cvtps_epi32(_mm256_mul_ps(v[c], inv));
    q[c] = _mm256_max_epi32(_mm256_min_epi32(q[c], _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
  }
  // int32 -> int8: the packs interleave 128-bit lanes; the permutation puts the 32 codes back in order
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  halves[0] = sum_lanes(_mm256_add_epi32(q[0], q[1]));
  halves[1] = sum_lanes(_mm256_add_epi32(q[2], q[3]));
  return true;
}
#endif

// The scalar form of quantize_block (builds without AVX2)
template <typename T>
inline bool quantize_block_scalar(const T* xb, int8_t* qb, float& d, int32_t halves[2]) {
  float v[kBlock], amax = 0.f, spoiled = 0.f;
  for (int64_t j = 0; j < kBlock; ++j) {
    v[j] = static_cast<float>(xb[j]);
    amax = std::max(amax, std::fabs(v[j]));  // (a NaN never wins a max: `spoiled` notes it)
    spoiled += v[j] * 0.f;  // NaN where any v is NaN or infinite, else 0
  }
  if (spoiled != 0.f) return false;
  d = amax / 127.f;
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  halves[0] = halves[1] = 0;
  for (int64_t j = 0; j < kBlock; ++j) {
    const int32_t q = static_cast<int32_t>(std::nearbyint(v[j] * inv));
    qb[j] = static_cast<int8_t>(std::clamp(q, -127, 127));
    halves[j / kHalfBlock] += qb[j];
  }
  return true;
}

template <typename T>
void quantize_rows(const T* x, int64_t M, int64_t K, QuantizedRows& out) {
  const int64_t G = K / kBlock;
  out.q.resize(M * K);
  out.scale.resize(M * G);
  out.scaled_sum.resize(M * G);
  out.sum.resize(M * G);
  out.half_sum.resize(M * G * 2);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      const T* xb = x + m * K + g * kBlock;
      int8_t* qb = out.q.data() + m * K + g * kBlock;
      const int64_t b = m * G + g;
      float d = 0.f;
      int32_t halves[2] = {0, 0};
#if defined(SPECEXEC_SIMD)
      const bool finite = quantize_block(xb, qb, d, halves);
#else
      const bool finite = quantize_block_scalar(xb, qb, d, halves);
#endif
      if (!finite) {
        // torch's product spoils a row holding NaN or Inf; codes cannot: a NaN scale does (every output
        // of the row sums this block's 0 * NaN), so the request fails on its NaN row instead of going on
        std::fill(qb, qb + kBlock, int8_t{0});
        const float nan = std::numeric_limits<float>::quiet_NaN();
        out.scale[b] = out.scaled_sum[b] = nan;
        out.sum[b] = out.half_sum[b * 2] = out.half_sum[b * 2 + 1] = 0;
        continue;
      }
      const int32_t sum = halves[0] + halves[1];
      out.scale[b] = d;
      out.scaled_sum[b] = d * static_cast<float>(sum);
      out.sum[b] = sum;
      out.half_sum[b * 2] = halves[0];
      out.half_sum[b * 2 + 1] = halves[1];
    }
  }
}

#if defined(SPECEXEC_SIMD)
// acc + 32 unsigned bytes times 32 signed bytes, summed in groups of four: 8 int32 lanes.
inline __m256i dot_add(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// the 4 bytes at p in every 32-bit lane
inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// sum over c of the unsigned vectors u[c] times x's bytes 4c..4c+3 broadcast: each lane one weight row's
// dot with the block (two chains, so consecutive dpbusd do not wait on each other)
inline __m256i tile_dot(const __m256i* u, const int8_t* x) {
  __m256i even = dot_add(_mm256_setzero_si256(), u[0], broadcast4(x));
  __m256i odd = dot_add(_mm256_setzero_si256(), u[1], broadcast4(x + 4));
#pragma GCC unroll 3
  for (int c = 2; c < 8; c += 2) {
    even = dot_add(even, u[c], broadcast4(x + 4 * c));
    odd = dot_add(odd, u[c + 1], broadcast4(x + 4 * c + 4));
  }
  return _mm256_add_epi32(even, odd);
}

// tile_dot over one half of the block: vectors u[0..3] (its 16 inputs) with x's bytes 0..15
inline __m256i half_tile_dot(const __m256i* u, const int8_t* x) {
  const __m256i even = dot_add(dot_add(_mm256_setzero_si256(), u[0], broadcast4(x)), u[2], broadcast4(x + 8));
  const __m256i odd = dot_add(dot_add(_mm256_setzero_si256(), u[1], broadcast4(x + 4)), u[3], broadcast4(x + 12));
  return _mm256_add_epi32(even, odd);
}

// a tile's block of int8 codes as its 8 vectors; with VNNI as unsigned bytes w + 128 (`dpbusd` multiplies
// unsigned by signed: the caller takes 128 * sum(xq) off, exact in int32)
inline void load_q8_block(const int8_t* block, __m256i* w) {
#pragma GCC unroll 8
  for (int c = 0; c < 8; ++c) {
    w[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * c));
#if defined(SPECEXEC_VNNI)
    w[c] = _mm256_xor_si256(w[c], _mm256_set1_epi8(static_cast<char>(0x80)));
#endif
  }
}

// a tile's block of 5-bit codes (`tile_layout.h`) as `load_q8_block` gives the int8 codes they stand for:
// the value less `centre` (16 without offsets, else 0), with VNNI as the unsigned byte code + 128
inline void load_q5_block(const uint8_t* block, int centre, __m256i* w) {
  specexec_q5::load_values(block, w);
#if defined(SPECEXEC_VNNI)
  const __m256i shift = _mm256_set1_epi8(static_cast<char>(128 - centre));  // (wraps to +128 for centre 0)
#else
  const __m256i shift = _mm256_set1_epi8(static_cast<char>(-centre));
#endif
#pragma GCC unroll 8
  for (int c = 0; c < 8; ++c) w[c] = _mm256_add_epi8(w[c], shift);
}

// the same with w's signs moved onto x (the AVX2 way round: see q8_tile)
inline __m256i half_tile_dot_signed(const __m256i* w, const int8_t* x) {
  __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
#pragma GCC unroll 2
  for (int c = 0; c < 4; c += 2) {
    even = dot_add(even, _mm256_abs_epi8(w[c]), _mm256_sign_epi8(broadcast4(x + 4 * c), w[c]));
    odd = dot_add(odd, _mm256_abs_epi8(w[c + 1]), _mm256_sign_epi8(broadcast4(x + 4 * c + 4), w[c + 1]));
  }
  return _mm256_add_epi32(even, odd);
}
#endif

inline float half_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// A tile block's 8 weight scales, held in float32 or float16, as floats (float16 -> float32 is exact).
inline float scale_at(const float* scales, int64_t i) { return scales[i]; }
inline float scale_at(const c10::Half* scales, int64_t i) { return static_cast<float>(scales[i]); }
#if defined(SPECEXEC_SIMD)
inline __m256 load_scales(const float* scales) { return _mm256_loadu_ps(scales); }
inline __m256 load_scales(const c10::Half* scales) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
}
#endif

// out[r * 8 + i] = activation row m0 + r times weight row i of one Q4 tile, r < R (a constant: the
// accumulators stay in registers); `rows` of them are real (the scalar path computes only those)
template <int R>
inline void q4_tile(const uint8_t* tile, const QuantizedRows& xr, int64_t m0, int64_t rows, int64_t K, float* out) {
  const int64_t G = K / kBlock;
  const int8_t* xq = xr.q.data() + m0 * K;
  const float* xd = xr.scale.data() + m0 * G;
  const float* xs = xr.scaled_sum.data() + m0 * G;
#if defined(SPECEXEC_SIMD)
  (void)rows;
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* block = tile + g * kQ4Bytes;
    __m256i u[8];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * v));
      u[v] = _mm256_and_si256(packed, low);
      u[v + 4] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 128)));
    const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 144)));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 dot = _mm256_cvtepi32_ps(tile_dot(u, xq + r * K + g * kBlock));
      acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(d, _mm256_set1_ps(xd[r * G + g])), acc[r]);
      acc[r] = _mm256_fmadd_ps(mn, _mm256_set1_ps(xs[r * G + g]), acc[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * kTile, acc[r]);
#else
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < kTile; ++i) {
      float total = 0.f;
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* block = tile + g * kQ4Bytes;
        const int8_t* x = xq + r * K + g * kBlock;
        int32_t dot = 0;
        for (int64_t c = 0; c < 8; ++c) {
          for (int64_t j = 0; j < 4; ++j) {
            const uint8_t byte = block[32 * (c % 4) + 4 * i + j];
            dot += (c < 4 ? byte & 0x0F : byte >> 4) * x[4 * c + j];
          }
        }
        const float d = half_to_float(block + 128 + 2 * i), mn = half_to_float(block + 144 + 2 * i);
        total += d * xd[r * G + g] * static_cast<float>(dot) + mn * xs[r * G + g];
      }
      out[r * kTile + i] = total;
    }
  }
#endif
}

#if defined(SPECEXEC_SIMD) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define SPECEXEC_TILE_PAIRS 1  // two tiles a 512-bit pass
// `tile_dot` for two tiles side by side: each lane one weight row's dot with the block's 32 activation
// bytes (u[c]: the pair's unsigned vectors c), two chains
inline __m512i tile_pair_dot(const __m512i* u, const int8_t* x) {
  auto group = [x](int c) {  // x's bytes 4c..4c+3 in every 32-bit lane
    int32_t v;
    std::memcpy(&v, x + 4 * c, 4);
    return _mm512_set1_epi32(v);
  };
  __m512i even = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[0], group(0));
  __m512i odd = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[1], group(1));
#pragma GCC unroll 3
  for (int c = 2; c < 8; c += 2) {
    even = _mm512_dpbusd_epi32(even, u[c], group(c));
    odd = _mm512_dpbusd_epi32(odd, u[c + 1], group(c + 1));
  }
  return _mm512_add_epi32(even, odd);
}

// Two Q4 tiles side by side in 512-bit vectors (tile t in lanes 0..7, tile t + 1 in lanes 8..15): each
// broadcast activation group feeds 16 weight rows instead of 8, so a block's loads per row halve (the
// 256-bit pass is bound by them). Every lane does the 256-bit pass's arithmetic in its order: the same
// results, bit for bit (tested). out[r * 16 + i]: row i of the pair (i < 8: tile t).
template <int R>
inline void q4_tile_pair(const uint8_t* tile0, const uint8_t* tile1, const QuantizedRows& xr, int64_t m0,
                         int64_t K, float* out) {
  const int64_t G = K / kBlock;
  const int8_t* xq = xr.q.data() + m0 * K;
  const float* xd = xr.scale.data() + m0 * G;
  const float* xs = xr.scaled_sum.data() + m0 * G;
  __m512 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  auto both = [](const uint8_t* a, const uint8_t* b) {  // 32 bytes of each tile, tile 0 low
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
  };
  auto halves = [](const uint8_t* a, const uint8_t* b) {  // 8 float16 of each tile as 16 floats
    return _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1));
  };
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* b0 = tile0 + g * kQ4Bytes;
    const uint8_t* b1 = tile1 + g * kQ4Bytes;
    __m512i u[8];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512i packed = both(b0 + 32 * v, b1 + 32 * v);
      u[v] = _mm512_and_si512(packed, low);
      u[v + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
    }
    const __m512 d = halves(b0 + 128, b1 + 128), mn = halves(b0 + 144, b1 + 144);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 dot = _mm512_cvtepi32_ps(tile_pair_dot(u, xq + r * K + g * kBlock));
      acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, _mm512_set1_ps(xd[r * G + g])), acc[r]);
      acc[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xs[r * G + g]), acc[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * 2 * kTile, acc[r]);
}
#endif

// The same for one int8 tile: wd, the tile's blocks' scales (8 a block; nullptr: one scale a row, applied
// by the caller). Five: the codes come from a 5-bit tile (`tile_layout.h`; block scales), each less
// `centre`, unpacked into the vectors an int8 tile's load gives: the same arithmetic from there on.
template <int R, bool Five = false, typename S = float>
inline void q8_tile(const uint8_t* tile, const S* wd, int centre, const QuantizedRows& xr, int64_t m0,
                    int64_t rows, int64_t K, float* out) {
  constexpr int64_t kBytes = Five ? kQ5Bytes : kQ8Bytes;
  const int64_t G = K / kBlock;
  const int8_t* xq = xr.q.data() + m0 * K;
  const float* xd = xr.scale.data() + m0 * G;
#if defined(SPECEXEC_SIMD)
  (void)rows;
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m256i w[8];
    if constexpr (Five) {
      load_q5_block(tile + g * kBytes, centre, w);
    } else {
      load_q8_block(reinterpret_cast<const int8_t*>(tile) + g * kBytes, w);
    }
    const __m256 scale = wd == nullptr ? _mm256_set1_ps(1.f) : load_scales(wd + g * kTile);
#if defined(SPECEXEC_VNNI)
    // sum((w + 128) * xq) - 128 * sum(xq)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i biased = tile_dot(w, xq + r * K + g * kBlock);
      const __m256i dot = _mm256_sub_epi32(biased, _mm256_set1_epi32(128 * xr.sum[(m0 + r) * G + g]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, _mm256_set1_ps(xd[r * G + g])), acc[r]);
    }
#else
    // |w| as unsigned times xq with w's sign, llama.cpp's way round: |-128| is 128 as an unsigned byte,
    // where -128 carrying a negative xq's sign stayed -128 (the sign flipped); xq is in -127..127, so its
    // negation never overflows, and maddubs's pair sums stay within 2 * 128 * 127 (an AVX2 build on the
    // 2-core EPYC, a 1536x576 layer: 0.92x the old way's time at 4 rows, 1.02x at 1)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* x = xq + r * K + g * kBlock;
      __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int c = 0; c < 8; c += 2) {
        const __m256i x0 = broadcast4(x + 4 * c), x1 = broadcast4(x + 4 * c + 4);
        even = dot_add(even, _mm256_abs_epi8(w[c]), _mm256_sign_epi8(x0, w[c]));
        odd = dot_add(odd, _mm256_abs_epi8(w[c + 1]), _mm256_sign_epi8(x1, w[c + 1]));
      }
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_add_epi32(even, odd));
      acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(scale, _mm256_set1_ps(xd[r * G + g])), acc[r]);
    }
#endif
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * kTile, acc[r]);
#else
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < kTile; ++i) {
      float total = 0.f;
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* block = tile + g * kBytes;
        const int8_t* x = xq + r * K + g * kBlock;
        int32_t dot = 0;
        for (int64_t c = 0; c < 8; ++c) {
          for (int64_t j = 0; j < 4; ++j) dot += block_code(block, Five, centre, c, 4 * i + j) * x[4 * c + j];
        }
        total += static_cast<float>(dot) * ((wd == nullptr ? 1.f : scale_at(wd, g * kTile + i)) * xd[r * G + g]);
      }
      out[r * kTile + i] = total;
    }
  }
#endif
}

// The same for one int8 tile whose weights have a scale per 16 inputs (GGUF's Q6_K: codes q - 32 in
// -32..31, scale d * scale_j): wd holds the tile's half-blocks' scales, 8 a half-block. Each half's dot
// is taken apart and scaled by its own weight scale; the activation's block scale serves both halves.
template <int R>
inline void q8_half_tile(const int8_t* tile, const float* wd, const QuantizedRows& xr, int64_t m0, int64_t rows,
                         int64_t K, float* out) {
  const int64_t G = K / kBlock;
  const int8_t* xq = xr.q.data() + m0 * K;
  const float* xd = xr.scale.data() + m0 * G;
#if defined(SPECEXEC_SIMD)
  (void)rows;
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m256i w[8];
    load_q8_block(tile + g * kQ8Bytes, w);
    const __m256 scale_lo = _mm256_loadu_ps(wd + 2 * g * kTile);
    const __m256 scale_hi = _mm256_loadu_ps(wd + (2 * g + 1) * kTile);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* x = xq + r * K + g * kBlock;
#if defined(SPECEXEC_VNNI)  // w + 128 as unsigned bytes, then 128 * sum(xq) of the half taken off
      const int32_t* half_sum = xr.half_sum.data() + ((m0 + r) * G + g) * 2;
      const __m256i lo = _mm256_sub_epi32(half_tile_dot(w, x), _mm256_set1_epi32(128 * half_sum[0]));
      const __m256i hi = _mm256_sub_epi32(half_tile_dot(w + 4, x + kHalfBlock), _mm256_set1_epi32(128 * half_sum[1]));
#else
      const __m256i lo = half_tile_dot_signed(w, x);
      const __m256i hi = half_tile_dot_signed(w + 4, x + kHalfBlock);
#endif
      const __m256 xdr = _mm256_set1_ps(xd[r * G + g]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(scale_lo, xdr), acc[r]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(scale_hi, xdr), acc[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * kTile, acc[r]);
#else
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < kTile; ++i) {
      float total = 0.f;
      for (int64_t g = 0; g < G; ++g) {
        const int8_t* block = tile + g * kQ8Bytes;
        const int8_t* x = xq + r * K + g * kBlock;
        for (int64_t h = 0; h < 2; ++h) {
          int32_t dot = 0;
          for (int64_t c = 4 * h; c < 4 * h + 4; ++c) {
            for (int64_t j = 0; j < 4; ++j) dot += block[32 * c + 4 * i + j] * x[4 * c + j];
          }
          total += static_cast<float>(dot) * (wd[(2 * g + h) * kTile + i] * xd[r * G + g]);
        }
      }
      out[r * kTile + i] = total;
    }
  }
#endif
}

#if defined(SPECEXEC_TILE_PAIRS)
// Two int8 tiles side by side, as `q4_tile_pair` does for Q4 (the VNNI build's w + 128 form); wd: both
// tiles' block scales (nullptr: one scale a row, applied by the caller). out[r * 16 + i].
template <int R, bool Five = false, typename S = float>
inline void q8_tile_pair(const uint8_t* tile0, const uint8_t* tile1, const S* wd0, const S* wd1, int centre,
                         const QuantizedRows& xr, int64_t m0, int64_t K, float* out) {
  constexpr int64_t kBytes = Five ? kQ5Bytes : kQ8Bytes;
  const int64_t G = K / kBlock;
  const int8_t* xq = xr.q.data() + m0 * K;
  const float* xd = xr.scale.data() + m0 * G;
  __m512 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* b0 = tile0 + g * kBytes;
    const uint8_t* b1 = tile1 + g * kBytes;
    __m512i w[8];
    if constexpr (Five) {  // each tile's vectors already as unsigned code + 128 (a VNNI build's load)
      __m256i w0[8], w1[8];
      load_q5_block(b0, centre, w0);
      load_q5_block(b1, centre, w1);
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) w[c] = _mm512_inserti64x4(_mm512_castsi256_si512(w0[c]), w1[c], 1);
    } else {
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512i both = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 32 * c))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + 32 * c)), 1);
        w[c] = _mm512_xor_si512(both, bias);
      }
    }
    const __m512 scale =
        wd0 == nullptr ? _mm512_set1_ps(1.f)
                       : _mm512_insertf32x8(_mm512_castps256_ps512(load_scales(wd0 + g * kTile)),
                                            load_scales(wd1 + g * kTile), 1);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512i biased = tile_pair_dot(w, xq + r * K + g * kBlock);
      const __m512i dot = _mm512_sub_epi32(biased, _mm512_set1_epi32(128 * xr.sum[(m0 + r) * G + g]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, _mm512_set1_ps(xd[r * G + g])), acc[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * 2 * kTile, acc[r]);
}
#endif

#if defined(SPECEXEC_TILE_PAIRS)
constexpr bool kTilePairs = true;
#else
constexpr bool kTilePairs = false;
#endif
// Pairs only from this many rows: there the pass is compute-bound and pairs gain (a 3072x576 Q4 layer at
// 32 rows, weights streamed from memory: 0.8x the time); below it, with the weights streamed from memory
// (a decode or verify step reads ~100 MB), the two tiles' interleaved reads ran 1.5x slower than one
// tile's sequential ones.
constexpr int64_t kPairRows = 16;

// Quantize x's rows, then out[m, 8t + i] = tile_fn(R, t, count, xr, m0, rows, K, result) over the N / 8 weight
// tiles split across threads: `rows` (<= R) real activation rows from m0, R their count rounded to a compiled
// one; `count` tiles from t (1, or 2 where `pairs`: result[r * 8 * count + i]).
template <typename TileFn>
at::Tensor tiled_linear(const at::Tensor& x_in, int64_t tiles, TileFn tile_fn, const char* name, bool pairs = false) {
  TORCH_CHECK(x_in.dim() == 2, name, ": x must be [M, K]");
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = tiles * kTile;
  TORCH_CHECK(K % kBlock == 0, name, ": the input features must be a multiple of ", kBlock, ", got ", K);
  QuantizedRows xr;
  switch (x.scalar_type()) {
    case at::kFloat: quantize_rows(x.data_ptr<float>(), M, K, xr); break;
    case at::kBFloat16: quantize_rows(x.data_ptr<c10::BFloat16>(), M, K, xr); break;
    case at::kHalf: quantize_rows(x.data_ptr<c10::Half>(), M, K, xr); break;
    default: TORCH_CHECK(false, name, ": x must be float32, bfloat16 or float16");
  }
  at::Tensor out = at::empty({M, N}, x.options());  // written in x's dtype, rounded as a float result's .to()
  pairs = pairs && M >= kPairRows;
  const int64_t step = pairs ? 2 : 1, units = (tiles + step - 1) / step;  // a unit: `step` tiles
  auto run = [&](auto* op) {
    at::parallel_for(0, units, pairs ? 2 : 4, [&](int64_t begin, int64_t end) {
      float result[kRowTile * 2 * kTile];
      for (int64_t unit = begin; unit < end; ++unit) {
        const int64_t t = unit * step, count = std::min(step, tiles - t), width = count * kTile;
        for (int64_t m0 = 0; m0 < M; m0 += kRowTile) {
          const int64_t rows = std::min(kRowTile, M - m0);
          switch (rows) {
            case 1: tile_fn(std::integral_constant<int, 1>{}, t, count, xr, m0, rows, K, result); break;
            case 2: tile_fn(std::integral_constant<int, 2>{}, t, count, xr, m0, rows, K, result); break;
            case 3: tile_fn(std::integral_constant<int, 3>{}, t, count, xr, m0, rows, K, result); break;
            default: tile_fn(std::integral_constant<int, 4>{}, t, count, xr, m0, rows, K, result); break;
          }
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t i = 0; i < width; ++i) {
              specexec_convert::put(op + (m0 + r) * N + t * kTile + i, result[r * width + i]);
            }
          }
        }
      }
    });
  };
  switch (x.scalar_type()) {
    case at::kFloat: run(out.data_ptr<float>()); break;
    case at::kBFloat16: run(out.data_ptr<c10::BFloat16>()); break;
    default: run(out.data_ptr<c10::Half>()); break;
  }
  return out;
}

// x [M, K]; tiles [N / 8, K / 32 * 160] uint8 (`pack_q4`) -> [M, N]
at::Tensor q4_linear(at::Tensor x, at::Tensor tiles) {
  TORCH_CHECK(tiles.scalar_type() == at::kByte && tiles.is_contiguous() && tiles.dim() == 2,
              "q4_linear: tiles [N / 8, K / 32 * 160] uint8, contiguous");
  TORCH_CHECK(x.size(-1) % kBlock == 0, "q4_linear: the input features must be a multiple of ", kBlock);
  const int64_t T = tiles.size(0), G = x.size(-1) / kBlock;
  TORCH_CHECK(tiles.size(1) == G * kQ4Bytes, "q4_linear: tiles [N / 8, K / 32 * 160] for x [M, K]");
  const uint8_t* tp = tiles.data_ptr<uint8_t>();
  return tiled_linear(
      x, T,
      [&](auto tile_rows, int64_t t, int64_t count, const QuantizedRows& xr, int64_t m0, int64_t rows, int64_t K,
          float* result) {
        constexpr int R = decltype(tile_rows)::value;
#if defined(SPECEXEC_TILE_PAIRS)
        if (count == 2) {
          q4_tile_pair<R>(tp + t * G * kQ4Bytes, tp + (t + 1) * G * kQ4Bytes, xr, m0, K, result);
          return;
        }
#endif
        (void)count;
        q4_tile<R>(tp + t * G * kQ4Bytes, xr, m0, rows, K, result);
      },
      "q4_linear", kTilePairs);
}

// Adds each block's offset term to a tile's results: result[r * width + c * 8 + i] += sum_g m[g, i] *
// xd[r, g] * sum(xq[r, g]) for the `count` tiles from t (offsets tiled as the block scales, 8 a tile's
// block), as q4_tile adds Q4_1's: the weights q * d + m of GGUF's Q5_1 and Q5_K. After the dots rather
// than inside each of the three kernels: the same sum in another order, within the int8 step's bound.
inline void add_block_offsets(const float* offsets, int64_t t, int64_t count, const QuantizedRows& xr, int64_t m0,
                              int64_t rows, int64_t G, float* result) {
  const int64_t width = count * kTile;
  for (int64_t c = 0; c < count; ++c) {
    const float* m = offsets + (t + c) * G * kTile;
    for (int64_t r = 0; r < rows; ++r) {
      const float* xs = xr.scaled_sum.data() + (m0 + r) * G;
      float* out = result + r * width + c * kTile;
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t i = 0; i < kTile; ++i) out[i] += m[g * kTile + i] * xs[g];
      }
    }
  }
}

// x [M, K]; tiles [N / 8, K / 32 * 256] int8 (`pack_q8`) or [N / 8, K / 32 * 160] uint8 (`pack_q5`: 5-bit
// codes, with block scales); scale [N] float32 (one per row), [N / 8, K / 32 * 8] (one per block, tiled as
// the codes: `tile_block_scales`; float32 or float16) or [N / 8, K / 16 * 8] (one per half-block of 16
// inputs, tiled the same way; int8 tiles); offset: none, or [N / 8, K / 32 * 8] (one per block of 32,
// tiled as the block scales: weight = code * scale + offset; 5-bit codes are their value less 16 without
// offsets, the value with) -> [M, N]
at::Tensor q8_linear(at::Tensor x, at::Tensor tiles, at::Tensor scale, std::optional<at::Tensor> offset) {
  const bool five = tiles.scalar_type() == at::kByte, half_scales = scale.scalar_type() == at::kHalf;
  TORCH_CHECK((five || tiles.scalar_type() == at::kChar) && (half_scales || scale.scalar_type() == at::kFloat) &&
                  tiles.is_contiguous() && scale.is_contiguous() && tiles.dim() == 2,
              "q8_linear: tiles int8 [N / 8, K / 32 * 256] or uint8 [N / 8, K / 32 * 160], scale float32 (or "
              "float16 block scales), contiguous");
  TORCH_CHECK(x.size(-1) % kBlock == 0, "q8_linear: the input features must be a multiple of ", kBlock);
  const int64_t T = tiles.size(0), G = x.size(-1) / kBlock, bytes = five ? kQ5Bytes : kQ8Bytes;
  const bool per_block = scale.dim() == 2, per_half = per_block && scale.size(1) == 2 * G * kTile;
  TORCH_CHECK(tiles.size(1) == G * bytes && (per_block || scale.dim() == 1) &&
                  (per_block ? scale.size(0) == T && (per_half || scale.size(1) == G * kTile)
                             : scale.size(0) == T * kTile),
              "q8_linear: tiles [N / 8, K / 32 * 256] (int8) or [N / 8, K / 32 * 160] (uint8), scale [N], "
              "[N / 8, K / 32 * 8] or [N / 8, K / 16 * 8] for x [M, K]");
  TORCH_CHECK(!five || (per_block && !per_half), "q8_linear: 5-bit tiles take one scale per block of 32");
  TORCH_CHECK(!half_scales || (per_block && !per_half), "q8_linear: float16 scales are one per block of 32");
  if (offset.has_value()) {
    TORCH_CHECK(per_block && offset->scalar_type() == at::kFloat && offset->is_contiguous() && offset->dim() == 2 &&
                    offset->size(0) == T && offset->size(1) == G * kTile,
                "q8_linear: offset float32 [N / 8, K / 32 * 8], contiguous, with block scales");
  }
  const uint8_t* tp = static_cast<const uint8_t*>(tiles.data_ptr());
  const float* sp = half_scales ? nullptr : scale.data_ptr<float>();
  const float* mp = offset.has_value() ? offset->data_ptr<float>() : nullptr;
  const int centre = five && mp == nullptr ? kQ5Centre : 0;
  if (per_half) {  // one tile at a time: no pair variant
    return tiled_linear(
        x, T,
        [&](auto tile_rows, int64_t t, int64_t, const QuantizedRows& xr, int64_t m0, int64_t rows, int64_t K,
            float* result) {
          constexpr int R = decltype(tile_rows)::value;
          q8_half_tile<R>(reinterpret_cast<const int8_t*>(tp) + t * G * kQ8Bytes, sp + t * 2 * G * kTile, xr, m0,
                          rows, K, result);
          if (mp != nullptr) add_block_offsets(mp, t, 1, xr, m0, rows, G, result);
        },
        "q8_linear");
  }
  // five_bits: std::true_type for 5-bit tiles, a constant in the kernels; scales: the block scales'
  // first element, float or c10::Half (nullptr with one scale a row)
  auto run = [&](auto five_bits, const auto* scales) {
    constexpr bool Five = decltype(five_bits)::value;
    return tiled_linear(
        x, T,
        [&](auto tile_rows, int64_t t, int64_t count, const QuantizedRows& xr, int64_t m0, int64_t rows, int64_t K,
            float* result) {
          constexpr int R = decltype(tile_rows)::value;
          const auto* wd = per_block ? scales + t * G * kTile : nullptr;
#if defined(SPECEXEC_TILE_PAIRS)
          if (count == 2) {
            const auto* wd1 = per_block ? scales + (t + 1) * G * kTile : nullptr;
            q8_tile_pair<R, Five>(tp + t * G * bytes, tp + (t + 1) * G * bytes, wd, wd1, centre, xr, m0, K, result);
          } else {
            q8_tile<R, Five>(tp + t * G * bytes, wd, centre, xr, m0, rows, K, result);
          }
#else
          q8_tile<R, Five>(tp + t * G * bytes, wd, centre, xr, m0, rows, K, result);
#endif
          if (mp != nullptr) add_block_offsets(mp, t, count, xr, m0, rows, G, result);
          if (!per_block) {  // one scale a row
            const int64_t width = count * kTile;
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t i = 0; i < width; ++i) result[r * width + i] *= sp[t * kTile + i];
            }
          }
        },
        "q8_linear", kTilePairs);
  };
  if (half_scales) {
    const c10::Half* hp = scale.data_ptr<c10::Half>();
    return five ? run(std::true_type{}, hp) : run(std::false_type{}, hp);
  }
  return five ? run(std::true_type{}, sp) : run(std::false_type{}, sp);
}

// Which integer dot product this build runs: "avx512_vnni", "avx_vnni", "avx2" or "scalar".
std::string quantized_dot_isa() {
#if defined(SPECEXEC_SIMD) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return "avx512_vnni";
#elif defined(SPECEXEC_SIMD) && defined(__AVXVNNI__)
  return "avx_vnni";
#elif defined(SPECEXEC_SIMD)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specexec_cpu, m) {
  m.def("q4_linear", &q4_linear);
  m.def("q8_linear(Tensor x, Tensor tiles, Tensor scale, Tensor? offset=None) -> Tensor", &q8_linear);
  m.def("quantized_dot_isa", &quantized_dot_isa);
}
