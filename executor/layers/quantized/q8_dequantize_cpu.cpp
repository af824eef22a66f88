// `q8_linear`'s weight tiles (`pack_q8`, with block or half-block scales and optional block offsets; or
// `pack_q5`'s 5-bit tiles, with block scales) as a dense matrix, for the prefill chunks that multiply by
// dense weights (`Int8BlockLinear.dequantized`).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "../float_convert.h"
#include "q5_values.h"
#include "tile_layout.h"

#include <cstdint>
#include <optional>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SPECEXEC_SIMD 1
#include <immintrin.h>
#endif

namespace {

using namespace specexec_tiles;

// x rounded to float as it stands: GCC would fuse x into a following add (one rounding, not two)
template <typename V>
inline V unfused(V x) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+x"(x));
#endif
  return x;
}

#if defined(SPECEXEC_SIMD)
// 8 floats stored as T, rounded as specexec_convert::put rounds each (bfloat16: to nearest even, NaN as
// c10's 0x7FC0)
inline void store8(float* p, __m256 w) { _mm256_storeu_ps(p, w); }
inline void store8(c10::Half* p, __m256 w) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT));
}
inline void store8(c10::BFloat16* p, __m256 w) {
  const __m256i u = _mm256_castps_si256(w);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(w, w, _CMP_UNORD_Q)));
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);  // 8 halves in order
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

// v[c]'s 32-bit lane i -> v[i]'s lane c (an 8x8 transpose): a tile's block, vector c holding chunk c of
// rows 0..7, becomes each row's 32 codes in order
inline void transpose8x8(__m256i* v) {
  __m256i t[8], u[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_epi32(v[k], v[k + 1]);
    t[k + 1] = _mm256_unpackhi_epi32(v[k], v[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
    u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
    u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
    u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
    v[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
  }
}
#endif

// The weights of `q8_linear`'s tiles as a dense [N, K] matrix in `dtype` (a prefill chunk's matmul): each
// code times its block's (or half-block's) scale, plus its block's offset, in float, then rounded to
// dtype: what torch's `codes.float() * scale + offset` and `.to(dtype)` give, bit for bit (the product
// rounded before the add: `unfused`). A tile's block is transposed in registers into its rows' codes, so
// each row's 32 weights are written as one run. Tiles split over torch's threads.
at::Tensor q8_dequantize(at::Tensor tiles, at::Tensor scale_in, std::optional<at::Tensor> offset,
                         at::ScalarType dtype) {
  // float16 block scales (exact ones: `q8_linear` reads them in place) widened once, exactly
  const at::Tensor scale = scale_in.scalar_type() == at::kHalf ? scale_in.to(at::kFloat) : scale_in;
  const bool five = tiles.scalar_type() == at::kByte;  // `pack_q5`'s tiles
  const int64_t bytes = five ? kQ5Bytes : kQ8Bytes;
  TORCH_CHECK((five || tiles.scalar_type() == at::kChar) && tiles.is_contiguous() && tiles.dim() == 2 &&
                  tiles.size(1) % bytes == 0,
              "q8_dequantize: tiles int8 [N / 8, K / 32 * 256] or uint8 [N / 8, K / 32 * 160], contiguous");
  const int64_t T = tiles.size(0), G = tiles.size(1) / bytes, K = G * kBlock;
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.dim() == 2 && scale.size(0) == T &&
                  (scale.size(1) == G * kTile || scale.size(1) == 2 * G * kTile),
              "q8_dequantize: block scales float32 (or float16) [N / 8, K / 32 * 8] or [N / 8, K / 16 * 8], "
              "contiguous");
  TORCH_CHECK(!offset.has_value() || (offset->scalar_type() == at::kFloat && offset->is_contiguous() &&
                                      offset->dim() == 2 && offset->size(0) == T && offset->size(1) == G * kTile),
              "q8_dequantize: offset float32 [N / 8, K / 32 * 8], contiguous");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "q8_dequantize: dtype float32, bfloat16 or float16");
  const bool per_half = scale.size(1) == 2 * G * kTile;
  TORCH_CHECK(!five || !per_half, "q8_dequantize: 5-bit tiles take one scale per block of 32");
  const uint8_t* tp = static_cast<const uint8_t*>(tiles.data_ptr());
  const float* sp = scale.data_ptr<float>();
  const float* mp = offset.has_value() ? offset->data_ptr<float>() : nullptr;
  const int centre = five && mp == nullptr ? kQ5Centre : 0;  // 5-bit values less this are the codes
  at::Tensor out = at::empty({T * kTile, K}, tiles.options().dtype(dtype));
  auto run = [&](auto* op) {
    at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t g = 0; g < G; ++g) {
          const uint8_t* block = tp + (t * G + g) * bytes;
          const float* first = per_half ? sp + (t * 2 * G + 2 * g) * kTile : sp + (t * G + g) * kTile;
          const float* second = per_half ? first + kTile : first;  // the scales of inputs 16..31
          const float* m = mp == nullptr ? nullptr : mp + (t * G + g) * kTile;
#if defined(SPECEXEC_SIMD)
          __m256i v[8];
          if (five) {
            specexec_q5::load_values(block, v);
            for (int c = 0; c < 8; ++c) v[c] = _mm256_sub_epi8(v[c], _mm256_set1_epi8(static_cast<char>(centre)));
          } else {
            for (int c = 0; c < 8; ++c) v[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * c));
          }
          transpose8x8(v);
          for (int64_t i = 0; i < kTile; ++i) {
            auto* row = op + (t * kTile + i) * K + g * kBlock;
            const __m128i halves[2] = {_mm256_castsi256_si128(v[i]), _mm256_extracti128_si256(v[i], 1)};
            for (int q = 0; q < 4; ++q) {  // inputs 8q..8q+7
              const __m128i bytes = q % 2 == 0 ? halves[q / 2] : _mm_srli_si128(halves[q / 2], 8);
              const __m256 codes = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
              __m256 w = unfused(_mm256_mul_ps(codes, _mm256_set1_ps((q < 2 ? first : second)[i])));
              if (m != nullptr) w = _mm256_add_ps(w, _mm256_set1_ps(m[i]));
              store8(row + 8 * q, w);
            }
          }
#else
          for (int64_t c = 0; c < 8; ++c) {
            for (int64_t i = 0; i < kTile; ++i) {
              auto* row = op + (t * kTile + i) * K + g * kBlock + 4 * c;
              for (int64_t j = 0; j < 4; ++j) {
                const int code = block_code(block, five, centre, c, 4 * i + j);
                float w = unfused(static_cast<float>(code) * (c < 4 ? first : second)[i]);
                if (m != nullptr) w = w + m[i];
                specexec_convert::put(row + j, w);
              }
            }
          }
#endif
        }
      }
    });
  };
  switch (dtype) {
    case at::kFloat: run(out.data_ptr<float>()); break;
    case at::kBFloat16: run(out.data_ptr<c10::BFloat16>()); break;
    default: run(out.data_ptr<c10::Half>()); break;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specexec_cpu, m) {
  m.def("q8_dequantize(Tensor tiles, Tensor scale, Tensor? offset, ScalarType dtype) -> Tensor", &q8_dequantize);
}
