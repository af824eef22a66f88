// Weight-only quantized matmuls for few rows (decode and verify) with integer dot products, llama.cpp's
// way: each activation row is quantized to int8 in blocks of 32 (one float scale per block, the block's
// absolute maximum over 127, round to nearest), and every block's dot with the weights is an integer
// dot product (AVX512-VNNI or AVX-VNNI `dpbusd`, else AVX2 `maddubs` + `madd`, else plain C++), scaled
// once per block in float.
//
// - q4_linear: 4-bit codes q in 0..15 with a float16 scale d and offset m per block of 32 inputs (weight
//   = q * d + m: GGUF's Q4_1 and specexec's int4). Per block: d * xd * sum(q * xq) + m * xd * sum(xq).
//   Each weight row is one record, read in one stream: its blocks' codes, 16 bytes a block (byte j holds
//   input j in its low nibble and input 16 + j in its high one), then their scales, then their offsets
//   (`pack_q4` in quantized_dot.py): 20 bytes a block, as GGUF's Q4_1.
// - q8_linear: int8 codes in -127..127 with a float scale per output row (specexec's int8), or per block
//   of 32 inputs (GGUF's Q8_0). Per block: xd * sum(w * xq), times the block's scale if it has one, by
//   the sign trick (|xq| as unsigned times w carrying xq's sign) so no product pair overflows AVX2's
//   16-bit sums; a row's scale multiplies its sum once at the end.
//
// The only rounding beyond the float path's is the activations' int8 step: |error| of a block's dot <=
// sum(|w|) * xd / 2. Output rows are split over torch's threads; x in float32, bfloat16 or float16, the
// output in x's dtype.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 32;  // inputs per activation scale (and per Q4 scale)
constexpr int64_t kRowTile = 4;  // activation rows one pass over a weight row serves

// Activation rows as int8 blocks: xq [M, K], xd [M, K / 32] (scale), xs [M, K / 32] (xd * sum(xq)).
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> scale, scaled_sum;
};

template <typename T>
void quantize_rows(const T* x, int64_t M, int64_t K, QuantizedRows& out) {
  const int64_t G = K / kBlock;
  out.q.resize(M * K);
  out.scale.resize(M * G);
  out.scaled_sum.resize(M * G);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      const T* xb = x + m * K + g * kBlock;
      float v[kBlock], amax = 0.f;
      for (int64_t j = 0; j < kBlock; ++j) {
        v[j] = static_cast<float>(xb[j]);
        amax = std::max(amax, std::fabs(v[j]));
      }
      const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      int32_t sum = 0;
      int8_t* qb = out.q.data() + m * K + g * kBlock;
      for (int64_t j = 0; j < kBlock; ++j) {
        const int32_t q = static_cast<int32_t>(std::nearbyint(v[j] * inv));
        qb[j] = static_cast<int8_t>(std::clamp(q, -127, 127));
        sum += qb[j];
      }
      out.scale[m * G + g] = d;
      out.scaled_sum[m * G + g] = d * static_cast<float>(sum);
    }
  }
}

#if defined(__AVX2__)
// 32 unsigned bytes times 32 signed bytes, summed in groups of four: 8 int32 lanes.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// out[m, n] for rows m0..m0+R of one Q4 weight row n (R a constant: the accumulators stay in registers)
template <int R>
inline void q4_row(const uint8_t* codes, const float* d, const float* mn, const QuantizedRows& xr, int64_t m0,
                   int64_t rows, int64_t K, float* result) {
  const int64_t G = K / kBlock;
#if defined(__AVX2__)
  const int8_t* xq = xr.q.data() + m0 * K;
  const float* xd = xr.scale.data() + m0 * G;
  const float* xs = xr.scaled_sum.data() + m0 * G;
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m128i low = _mm_set1_epi8(0x0F);
  for (int64_t g = 0; g < G; ++g) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + g * 16));
    const __m256i w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
    const __m256 dw = _mm256_set1_ps(d[g]);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * K + g * kBlock));
      const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(w, xv));
      acc[r] = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, _mm256_set1_ps(xd[r * G + g])), acc[r]);
    }
  }
  // the offsets' term, sum over blocks of m * xd * sum(xq), eight blocks a step
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    __m256 offset = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= G; g += 8) offset = _mm256_fmadd_ps(_mm256_loadu_ps(mn + g), _mm256_loadu_ps(xs + r * G + g), offset);
    float tail = 0.f;
    for (; g < G; ++g) tail += mn[g] * xs[r * G + g];
    result[r] = hsum(acc[r]) + hsum(offset) + tail;
  }
#else
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t m = m0 + r;
    float total = 0.f;
    for (int64_t g = 0; g < G; ++g) {
      const int8_t* xq = xr.q.data() + m * K + g * kBlock;
      int32_t dot = 0;
      for (int64_t j = 0; j < 16; ++j) {
        dot += (codes[g * 16 + j] & 0x0F) * xq[j] + (codes[g * 16 + j] >> 4) * xq[16 + j];
      }
      total += d[g] * xr.scale[m * G + g] * static_cast<float>(dot) + mn[g] * xr.scaled_sum[m * G + g];
    }
    result[r] = total;
  }
#endif
}

// out[m, n] for rows m0..m0+R of one int8 weight row: wd, its blocks' scales (nullptr: one scale for
// the row, applied by the caller)
template <int R>
inline void q8_row(const int8_t* w, const float* wd, const QuantizedRows& xr, int64_t m0, int64_t rows, int64_t K,
                   float* result) {
  const int64_t G = K / kBlock;
#if defined(__AVX2__)
  const int8_t* xq = xr.q.data() + m0 * K;
  const float* xd = xr.scale.data() + m0 * G;
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * kBlock));
    const float block_scale = wd == nullptr ? 1.f : wd[g];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * K + g * kBlock));
      const __m256i p = dot_u8s8(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(wv, xv));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(xd[r * G + g] * block_scale), acc[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) result[r] = hsum(acc[r]);
#else
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t m = m0 + r;
    float total = 0.f;
    for (int64_t g = 0; g < G; ++g) {
      int32_t dot = 0;
      for (int64_t j = 0; j < kBlock; ++j) dot += w[g * kBlock + j] * xr.q[m * K + g * kBlock + j];
      total += xr.scale[m * G + g] * (wd == nullptr ? 1.f : wd[g]) * static_cast<float>(dot);
    }
    result[r] = total;
  }
#endif
}

// Quantize x's rows, then out[m, n] = row_fn(n, m0, rows, results) over weight rows split across threads.
template <typename RowFn>
at::Tensor blocked_linear(const at::Tensor& x_in, int64_t N, RowFn row_fn, const char* name) {
  TORCH_CHECK(x_in.dim() == 2, name, ": x must be [M, K]");
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % kBlock == 0, name, ": the input features must be a multiple of ", kBlock, ", got ", K);
  QuantizedRows xr;
  switch (x.scalar_type()) {
    case at::kFloat: quantize_rows(x.data_ptr<float>(), M, K, xr); break;
    case at::kBFloat16: quantize_rows(x.data_ptr<c10::BFloat16>(), M, K, xr); break;
    case at::kHalf: quantize_rows(x.data_ptr<c10::Half>(), M, K, xr); break;
    default: TORCH_CHECK(false, name, ": x must be float32, bfloat16 or float16");
  }
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    float result[kRowTile];
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t m0 = 0; m0 < M; m0 += kRowTile) {
        const int64_t rows = std::min(kRowTile, M - m0);
        switch (rows) {
          case 1: row_fn(std::integral_constant<int, 1>{}, n, xr, m0, K, result); break;
          case 2: row_fn(std::integral_constant<int, 2>{}, n, xr, m0, K, result); break;
          case 3: row_fn(std::integral_constant<int, 3>{}, n, xr, m0, K, result); break;
          default: row_fn(std::integral_constant<int, 4>{}, n, xr, m0, K, result); break;
        }
        for (int64_t r = 0; r < rows; ++r) op[(m0 + r) * N + n] = result[r];
      }
    }
  });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

// float16 -> float32, n values (F16C eight at a time where the CPU has it)
inline void halves_to_floats(const uint16_t* h, float* f, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  }
#endif
  for (; i < n; ++i) f[i] = static_cast<float>(c10::Half(h[i], c10::Half::from_bits()));
}

// x [M, K]; rows [N, K / 32 * 20] uint8 (`pack_q4`: per weight row, its blocks' codes, 16 bytes each,
// then their scales, then their offsets, float16 each) -> [M, N]
at::Tensor q4_linear(at::Tensor x, at::Tensor rows) {
  TORCH_CHECK(rows.scalar_type() == at::kByte && rows.is_contiguous() && rows.dim() == 2,
              "q4_linear: rows [N, K / 32 * 20] uint8, contiguous");
  const int64_t N = rows.size(0), K = x.size(-1), G = K / kBlock;
  TORCH_CHECK(rows.size(1) == G * 20, "q4_linear: rows [N, K / 32 * 20] for x [M, K]");
  const uint8_t* rp = rows.data_ptr<uint8_t>();
  return blocked_linear(
      x, N,
      [&](auto tile, int64_t n, const QuantizedRows& xr, int64_t m0, int64_t K_, float* result) {
        const uint8_t* row = rp + n * G * 20;
        float scales[2 * 1024];  // d then m, float32 (K up to 32768)
        std::vector<float> large;
        float* dm = scales;
        if (G > 1024) large.resize(2 * G), dm = large.data();
        halves_to_floats(reinterpret_cast<const uint16_t*>(row + G * 16), dm, 2 * G);
        q4_row<decltype(tile)::value>(row, dm, dm + G, xr, m0, tile, K_, result);
      },
      "q4_linear");
}

// x [M, K]; weight [N, K] int8 in -127..127; scale [N] float32 (one per row) or [N, K / 32] (one per block,
// GGUF's Q8_0) -> [M, N]
at::Tensor q8_linear(at::Tensor x, at::Tensor weight, at::Tensor scale) {
  TORCH_CHECK(weight.scalar_type() == at::kChar && scale.scalar_type() == at::kFloat && weight.is_contiguous() &&
                  scale.is_contiguous(),
              "q8_linear: weight int8 and scale float32, contiguous");
  const int64_t N = weight.size(0), K = x.size(-1), G = K / kBlock;
  const bool per_block = scale.dim() == 2;
  TORCH_CHECK(weight.size(1) == K && scale.size(0) == N && (!per_block || scale.size(1) == G),
              "q8_linear: weight [N, K], scale [N] or [N, K / 32] for x [M, K]");
  const int8_t* wp = weight.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  return blocked_linear(
      x, N,
      [&](auto rows, int64_t n, const QuantizedRows& xr, int64_t m0, int64_t K_, float* result) {
        if (per_block) {
          q8_row<decltype(rows)::value>(wp + n * K_, sp + n * G, xr, m0, rows, K_, result);
        } else {
          q8_row<decltype(rows)::value>(wp + n * K_, nullptr, xr, m0, rows, K_, result);
          for (int64_t r = 0; r < rows; ++r) result[r] *= sp[n];
        }
      },
      "q8_linear");
}

// Which integer dot product this build runs: "avx512_vnni", "avx_vnni", "avx2" or "scalar".
std::string quantized_dot_isa() {
#if defined(__AVX2__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return "avx512_vnni";
#elif defined(__AVX2__) && defined(__AVXVNNI__)
  return "avx_vnni";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specexec_cpu, m) {
  m.def("q4_linear", &q4_linear);
  m.def("q8_linear", &q8_linear);
  m.def("quantized_dot_isa", &quantized_dot_isa);
}
