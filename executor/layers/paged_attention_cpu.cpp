// Attention of short queries (decode and verify rows) straight over the paged KV pool, on the CPU.
//
// out[g, t, h, :] = sum_k softmax_k(s_k) * V[g, k, h / rep, :],  s_k = softcap(scale * q[g, t, h, :] . K[g, k, h / rep, :])
// over the keys k a query at position p sees: k <= p, k < kv_len[g], and with a sliding window
// k > p - window. K and V of request g at key position k are read in place from the pool, at slot
// block_tables[g][k / block_size] * block_size + k % block_size: no gather, no copy, no cast of the pool.
// Sums and the softmax run in float (double for double); each (request, KV head) is one task of
// at::parallel_for (torch's threads), reading its keys and values once for all of its queries and the
// query heads that share them. float, bfloat16 and float16 pools run on the CPU's vector unit (AVX-512 or AVX2, whichever the
// build machine has: the module is compiled with -march=native); double, and head sizes that are not a
// multiple of the vector width, run the plain loops. A padded query (no key in range) attends key 0, as
// the torch path's mask does; its row is never read.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#include <immintrin.h>
#define W_HAS_VECTORS 1
#else
#define W_HAS_VECTORS 0
#endif

namespace {

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
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline vf vload(const c10::BFloat16* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
inline vf vload(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(vf a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline void vstore(float* p, vf a) { _mm256_storeu_ps(p, a); }
inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
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
// r = x - n ln 2 (in two parts), e^r by its degree-6 Taylor polynomial (|r| <= ln 2 / 2).
inline vf vexp(vf x) {
  x = vmax(x, vset(-87.3f));  // below: 0 (2^n would leave float's range)
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

template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};

template <typename T>
inline typename Acc<T>::type load(const T* p, int64_t i) {
  return static_cast<typename Acc<T>::type>(p[i]);
}

// The part of the work every path shares: which keys a query sees.
struct KeyRange {
  int64_t lo, hi;  // inclusive
};
inline KeyRange key_range(int64_t pos, int64_t kv_len, int64_t window) {
  int64_t hi = std::min(pos, kv_len - 1);
  int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
  if (hi < lo || hi < 0) {
    lo = hi = 0;
  }
  return {lo, hi};
}

// The keys [lo, hi] of one request, page by page: fn(slot, k) for each (no division per key).
template <typename F>
inline void for_each_key(const int64_t* table, int64_t block_size, KeyRange r, F&& fn) {
  for (int64_t b = r.lo / block_size; b <= r.hi / block_size; ++b) {
    const int64_t first = std::max(r.lo, b * block_size), last = std::min(r.hi, b * block_size + block_size - 1);
    const int64_t base = table[b] * block_size - b * block_size;  // the slot of key k is base + k
    for (int64_t k = first; k <= last; ++k) {
      fn(base + k, k);
    }
  }
}

// scores[r * n + j] -> softmax probabilities in place, for each of the rep rows; returns nothing, the
// rows' 1 / sum in inv_total
template <typename A>
inline void softmax_rows(A* scores, int64_t rep, int64_t n, A* inv_total) {
  for (int64_t r = 0; r < rep; ++r) {
    A* row = scores + r * n;
    A m = -std::numeric_limits<A>::infinity(), sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      m = std::max(m, row[j]);
    }
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      row[j] = std::exp(row[j] - m);
      sum += row[j];
    }
    inv_total[r] = A(1) / sum;
  }
}

struct Problem {
  int64_t G, Q, H, D, KVH, slots, max_blocks, rep, block_size, window;
  double scaling, softcap;
  const int64_t *tables, *positions, *lens;
};

// The plain loops: any dtype (double included), any head size.
template <typename T>
void attend_plain(const Problem& P, const T* qp, const T* kp, const T* vp, T* op) {
  using A = typename Acc<T>::type;
  const A scale = static_cast<A>(P.scaling), cap = static_cast<A>(P.softcap);
  at::parallel_for(0, P.G * P.Q * P.KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> query(P.rep * P.D), acc(P.rep * P.D), scores, inv(P.rep);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kvh = task % P.KVH, t = (task / P.KVH) % P.Q, g = task / (P.KVH * P.Q);
      const KeyRange range = key_range(P.positions[g * P.Q + t], P.lens[g], P.window);
      const int64_t n = range.hi - range.lo + 1, D = P.D, rep = P.rep;
      const T* qrow = qp + ((g * P.Q + t) * P.H + kvh * rep) * D;  // the rep heads, one after another
      for (int64_t i = 0; i < rep * D; ++i) {
        query[i] = load(qrow, i) * scale;
      }
      scores.resize(rep * n);
      const int64_t* table = P.tables + g * P.max_blocks;
      for_each_key(table, P.block_size, range, [&](int64_t slot, int64_t k) {
        const T* krow = kp + (slot * P.KVH + kvh) * D;
        for (int64_t r = 0; r < rep; ++r) {
          A dot = 0;
          for (int64_t i = 0; i < D; ++i) {
            dot += query[r * D + i] * load(krow, i);
          }
          scores[r * n + (k - range.lo)] = cap > 0 ? std::tanh(dot / cap) * cap : dot;
        }
      });
      softmax_rows(scores.data(), rep, n, inv.data());
      std::fill(acc.begin(), acc.end(), A(0));
      for_each_key(table, P.block_size, range, [&](int64_t slot, int64_t k) {
        const T* vrow = vp + (slot * P.KVH + kvh) * D;
        for (int64_t r = 0; r < rep; ++r) {
          const A p = scores[r * n + (k - range.lo)];
          for (int64_t i = 0; i < D; ++i) {
            acc[r * D + i] += p * load(vrow, i);
          }
        }
      });
      T* orow = op + ((g * P.Q + t) * P.H + kvh * rep) * D;
      for (int64_t r = 0; r < rep; ++r) {
        for (int64_t i = 0; i < D; ++i) {
          orow[r * D + i] = static_cast<T>(acc[r * D + i] * inv[r]);
        }
      }
    }
  });
}

#if W_HAS_VECTORS
// One row of a task: a (query, head) pair, with the keys it sees inside the task's key union.
struct Row {
  int64_t lo, hi;  // inclusive, as key positions
};

// softmax over each row's own keys (its slice [lo - base, hi - base] of scores): exp by the vector
// exp, every key outside the row set to exactly 0; inv_total[r] = 1 / the row's sum
inline void softmax_rows_vector(float* scores, const std::vector<Row>& rows, int64_t base, int64_t n, float* inv_total) {
  for (size_t r = 0; r < rows.size(); ++r) {
    float* row = scores + r * n;
    const int64_t a = rows[r].lo - base, b = rows[r].hi - base + 1;  // [a, b)
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = a; j < b; ++j) {
      m = std::max(m, row[j]);
    }
    std::fill(row, row + a, 0.f);
    std::fill(row + b, row + n, 0.f);
    const vf vm = vset(-m);
    vf vs = vzero();
    int64_t j = a;
    for (; j + W <= b; j += W) {
      const vf e = vexp(vadd(vload(row + j), vm));
      vstore(row + j, e);
      vs = vadd(vs, e);
    }
    float sum = vsum(vs);
    for (; j < b; ++j) {
      row[j] = std::exp(row[j] - m);
      sum += row[j];
    }
    inv_total[r] = 1.f / sum;
  }
}

// acc[r, :] = sum_k p[r, k] V[k, :] for the R rows, ROWS rows at a time with their sums in registers
// (D known at compile time): each V row is loaded once per ROWS rows.
template <int64_t D, int64_t ROWS, typename T>
inline void weighted_values(
    const T* vhead, int64_t slot_stride, const int64_t* table, int64_t block_size, KeyRange all,
    const float* p, int64_t n, int64_t R, float* acc) {
  constexpr int64_t C = D / W;
  for (int64_t r0 = 0; r0 < R; r0 += ROWS) {
    const int64_t m = std::min<int64_t>(ROWS, R - r0);
    vf a[ROWS][C];
    for (int64_t j = 0; j < ROWS; ++j) {
      for (int64_t c = 0; c < C; ++c) {
        a[j][c] = vzero();
      }
    }
    for_each_key(table, block_size, all, [&](int64_t slot, int64_t k) {
      const T* vrow = vhead + slot * slot_stride;
      vf vv[C];
      for (int64_t c = 0; c < C; ++c) {
        vv[c] = vload(vrow + c * W);
      }
      for (int64_t j = 0; j < ROWS; ++j) {
        if (j < m) {
          const vf w = vset(p[(r0 + j) * n + (k - all.lo)]);
          for (int64_t c = 0; c < C; ++c) {
            a[j][c] = vfma(w, vv[c], a[j][c]);
          }
        }
      }
    });
    for (int64_t j = 0; j < m; ++j) {
      for (int64_t c = 0; c < C; ++c) {
        vstore(acc + (r0 + j) * D + c * W, a[j][c]);
      }
    }
  }
}

// The vector path: float accumulation, D a multiple of W. One task per (request, KV head) takes all
// of its queries (a verify step's 1 + k) and the rep heads of each: every K and V row is loaded once
// for all of them, and four (query, head) rows at a time keep independent sums in flight.
template <typename T>
void attend_vector(const Problem& P, const T* qp, const T* kp, const T* vp, T* op) {
  const float scale = static_cast<float>(P.scaling), cap = static_cast<float>(P.softcap);
  const int64_t D = P.D, rep = P.rep, R = P.Q * rep;  // rows per task: query t, head r -> t * rep + r
  at::parallel_for(0, P.G * P.KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(R * D), acc(R * D), scores, inv(R);
    std::vector<Row> rows(R);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kvh = task % P.KVH, g = task / P.KVH;
      KeyRange all{std::numeric_limits<int64_t>::max(), -1};
      for (int64_t t = 0; t < P.Q; ++t) {
        const KeyRange range = key_range(P.positions[g * P.Q + t], P.lens[g], P.window);
        all = {std::min(all.lo, range.lo), std::max(all.hi, range.hi)};
        const T* qrow = qp + ((g * P.Q + t) * P.H + kvh * rep) * D;
        for (int64_t r = 0; r < rep; ++r) {
          rows[t * rep + r] = {range.lo, range.hi};
          for (int64_t i = 0; i < D; ++i) {
            query[(t * rep + r) * D + i] = static_cast<float>(qrow[r * D + i]) * scale;
          }
        }
      }
      const int64_t n = all.hi - all.lo + 1;
      scores.resize(R * n);
      const int64_t* table = P.tables + g * P.max_blocks;
      for_each_key(table, P.block_size, all, [&](int64_t slot, int64_t k) {
        const T* krow = kp + (slot * P.KVH + kvh) * D;
        for (int64_t r0 = 0; r0 < R; r0 += 4) {
          const int64_t m = std::min<int64_t>(4, R - r0);
          vf s0 = vzero(), s1 = vzero(), s2 = vzero(), s3 = vzero();
          const float* q0 = query.data() + r0 * D;
          for (int64_t i = 0; i < D; i += W) {
            const vf kv = vload(krow + i);
            s0 = vfma(vload(q0 + i), kv, s0);
            if (m > 1) s1 = vfma(vload(q0 + D + i), kv, s1);
            if (m > 2) s2 = vfma(vload(q0 + 2 * D + i), kv, s2);
            if (m > 3) s3 = vfma(vload(q0 + 3 * D + i), kv, s3);
          }
          const float dots[4] = {vsum(s0), m > 1 ? vsum(s1) : 0.f, m > 2 ? vsum(s2) : 0.f, m > 3 ? vsum(s3) : 0.f};
          for (int64_t j = 0; j < m; ++j) {
            scores[(r0 + j) * n + (k - all.lo)] = cap > 0 ? std::tanh(dots[j] / cap) * cap : dots[j];
          }
        }
      });
      softmax_rows_vector(scores.data(), rows, all.lo, n, inv.data());
      const T* vhead = vp + kvh * D;
      if (D == 64) {
        weighted_values<64, (W == 16 ? 4 : 2)>(vhead, P.KVH * D, table, P.block_size, all, scores.data(), n, R, acc.data());
      } else if (D == 128) {
        weighted_values<128, (W == 16 ? 2 : 1)>(vhead, P.KVH * D, table, P.block_size, all, scores.data(), n, R, acc.data());
      } else {
        std::fill(acc.begin(), acc.end(), 0.f);
        for_each_key(table, P.block_size, all, [&](int64_t slot, int64_t k) {
          const T* vrow = vhead + slot * P.KVH * D;
          for (int64_t i = 0; i < D; i += W) {
            const vf vv = vload(vrow + i);
            for (int64_t r = 0; r < R; ++r) {
              float* a = acc.data() + r * D + i;
              vstore(a, vfma(vset(scores[r * n + (k - all.lo)]), vv, vload(a)));
            }
          }
        });
      }
      for (int64_t t = 0; t < P.Q; ++t) {
        T* orow = op + ((g * P.Q + t) * P.H + kvh * rep) * D;
        for (int64_t r = 0; r < rep; ++r) {
          const float* a = acc.data() + (t * rep + r) * D;
          for (int64_t i = 0; i < D; ++i) {
            orow[r * D + i] = static_cast<T>(a[i] * inv[t * rep + r]);
          }
        }
      }
    }
  });
}
#endif

template <typename T>
void attend(const Problem& P, const T* qp, const T* kp, const T* vp, T* op) {
#if W_HAS_VECTORS
  if constexpr (!std::is_same_v<T, double>) {
    if (P.D % W == 0) {
      attend_vector<T>(P, qp, kp, vp, op);
      return;
    }
  }
#endif
  attend_plain<T>(P, qp, kp, vp, op);
}

at::Tensor paged_attention_short(
    at::Tensor q,             // [G, Q, H, D]
    at::Tensor kv,            // [2, slots, KVH, D] one layer's pool
    at::Tensor block_tables,  // [G, max_blocks]
    at::Tensor query_pos,     // [G, Q]
    at::Tensor kv_lens,       // [G]
    int64_t block_size,
    double scaling,
    int64_t window,
    double softcap) {
  TORCH_CHECK(q.dim() == 4 && kv.dim() == 4 && kv.size(0) == 2, "q [G, Q, H, D], kv [2, slots, KVH, D]");
  TORCH_CHECK(q.size(3) == kv.size(3) && q.size(2) % kv.size(2) == 0, "head shapes do not fit");
  TORCH_CHECK(q.scalar_type() == kv.scalar_type(), "q and kv must share a dtype");
  TORCH_CHECK(kv.is_contiguous(), "the KV pool must be contiguous");
  q = q.contiguous();
  block_tables = block_tables.to(at::kLong).contiguous();
  query_pos = query_pos.to(at::kLong).contiguous();
  kv_lens = kv_lens.to(at::kLong).contiguous();
  auto out = at::empty_like(q);
  const Problem P{
      q.size(0), q.size(1), q.size(2), q.size(3), kv.size(2), kv.size(1), block_tables.size(1),
      q.size(2) / kv.size(2), block_size, window, scaling, softcap,
      block_tables.data_ptr<int64_t>(), query_pos.data_ptr<int64_t>(), kv_lens.data_ptr<int64_t>()};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention_short", [&] {
    const scalar_t* kp = kv.data_ptr<scalar_t>();
    attend<scalar_t>(P, q.data_ptr<scalar_t>(), kp, kp + P.slots * P.KVH * P.D, out.data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(specexec_cpu, m) {
  m.def("paged_attention_short", &paged_attention_short);
}
