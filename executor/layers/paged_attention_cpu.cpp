// Attention of short queries (decode and verify rows) straight over the paged KV pool, on the CPU.
//
// out[g, t, h, :] = sum_k softmax_k(s_k) * V[g, k, h / rep, :],  s_k = softcap(scale * q[g, t, h, :] . K[g, k, h / rep, :])
// over the keys k a query at position p sees: k <= p, k < kv_len[g], and with a sliding window
// k > p - window. With tree_bits [G, Q] (a step verifying token trees, `sampling/tree_shape.py`) a query
// also skips the step's new keys that are not its ancestors: key k >= s (s = query_pos[g, 0], the
// request's first new token) is seen only when bit k - s of tree_bits[g, t] is set. K and V of request g at key position k are read in place from the pool, at slot
// block_tables[g][k / block_size] * block_size + k % block_size: no gather, no copy, no cast of the pool.
// Sums and the softmax run in float (double for double). float, bfloat16 and float16 pools run on the
// CPU's vector unit (AVX-512 or AVX2, whichever the build machine has: the module is compiled with
// -march=native): each (request, chunk of 128 key positions) is one task of at::parallel_for (torch's
// threads), or one task per KV head where a batch has few chunks, reading its keys and values once for
// all of its queries and the query heads that share them, its chunks merged afterwards
// (`attend_vector`). On a CPU with AVX512_BF16, bfloat16 pools take its bfloat16 dot product for the
// scores and for the values (the probabilities rounded to bfloat16 there, as flash attention does on
// GPUs). double, and head sizes that are not a multiple of the vector width, run the plain loops, one
// task per (request, query, KV head). A padded query (no key in range) attends key 0, as the torch
// path's mask does; its row is never read. Every page a request reads is checked to lie in the pool
// first (`check_pages`), and a NaN score makes its row NaN, as on torch's softmax.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_bf16_dot.h"
#include "attention_vectors.h"

namespace {

using namespace specexec_attention;

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
  const int64_t* tree_bits;  // [G, Q] or nullptr (no tree in the step)
};

// Whether the tree mask hides key k from query t of request g (never without tree_bits).
inline bool tree_hides(const Problem& P, int64_t g, int64_t t, int64_t k) {
  if (P.tree_bits == nullptr) return false;
  const int64_t rel = k - P.positions[g * P.Q];
  return rel >= 0 && rel < 64 && ((static_cast<uint64_t>(P.tree_bits[g * P.Q + t]) >> rel) & 1u) == 0;
}

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
        if (tree_hides(P, g, t, k)) {
          for (int64_t r = 0; r < rep; ++r) scores[r * n + (k - range.lo)] = -std::numeric_limits<A>::infinity();
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

// keys_f [W, D] = keys j < width (at `slots`, this KV head) as float, zeros after them. DC: D known at
// compile time (0: the runtime d), so the loops unroll.
template <int64_t DC, typename T>
inline void keys_to_float(const T* kp, const int64_t* slots, int64_t width, int64_t slot_stride, int64_t d,
                          float* keys_f) {
  const int64_t D = DC > 0 ? DC : d;
  for (int64_t j = 0; j < W; ++j) {
    float* dst = keys_f + j * D;
    if (j < width) {
      const T* krow = kp + slots[j] * slot_stride;
#pragma GCC unroll 8
      for (int64_t i = 0; i < D; i += W) vstore(dst + i, vload(krow + i));
    } else {
      std::fill(dst, dst + D, 0.f);
    }
  }
}

// dots[r * stride + j] = query row r . key j for W keys (keys_f [W, D]), R rows. DC as above: the W
// independent sums of a row are unrolled and overlap instead of waiting on one chain.
template <int64_t DC>
inline void key_dots(const float* query, int64_t R, int64_t d, const float* keys_f, float* dots, int64_t stride) {
  const int64_t D = DC > 0 ? DC : d;
  for (int64_t r = 0; r < R; ++r) {
    const float* q = query + r * D;
    vf sums[W];
#pragma GCC unroll 16
    for (int64_t j = 0; j < W; ++j) {
      const float* key = keys_f + j * D;
      vf s = vmul(vload(q), vload(key));
#pragma GCC unroll 8
      for (int64_t i = W; i < D; i += W) s = vfma(vload(q + i), vload(key + i), s);
      sums[j] = s;
    }
    vstore(dots + r * stride, transposed_sums(sums));
  }
}


// acc[r, :] = sum_k p[r, k] V[k, :] for ROWS rows (p's rows n apart) over the keys at `slots`, their sums
// in registers (D known at compile time): each V row is loaded once for the ROWS rows.
template <int64_t D, int64_t ROWS, typename T>
inline void weighted_values_rows(const T* vhead, int64_t slot_stride, const int64_t* slots, int64_t keys,
                                 const float* p, int64_t n, float* acc) {
  constexpr int64_t C = D / W;
  vf a[ROWS][C];
  for (int64_t j = 0; j < ROWS; ++j) {
    for (int64_t c = 0; c < C; ++c) a[j][c] = vzero();
  }
  for (int64_t k = 0; k < keys; ++k) {
    const T* vrow = vhead + slots[k] * slot_stride;
    vf vv[C];
    for (int64_t c = 0; c < C; ++c) vv[c] = vload(vrow + c * W);
    for (int64_t j = 0; j < ROWS; ++j) {
      const vf w = vset(p[j * n + k]);
      for (int64_t c = 0; c < C; ++c) a[j][c] = vfma(w, vv[c], a[j][c]);
    }
  }
  for (int64_t j = 0; j < ROWS; ++j) {
    for (int64_t c = 0; c < C; ++c) vstore(acc + j * D + c * W, a[j][c]);
  }
}

// the same for R rows, MAX_ROWS at a time
template <int64_t D, int64_t MAX_ROWS, typename T>
inline void weighted_values(const T* vhead, int64_t slot_stride, const int64_t* slots, int64_t keys, const float* p,
                            int64_t n, int64_t R, float* acc) {
  in_row_blocks<MAX_ROWS>(R, [&](auto rows, int64_t r0) {
    weighted_values_rows<D, decltype(rows)::value>(vhead, slot_stride, slots, keys, p + r0 * n, n, acc + r0 * D);
  });
}

// Ask for the rows of keys [from, to) (KV heads [h0, h1) of each) ahead of their use. The hardware's
// prefetchers follow one page of the pool at a time and wait on each new one; asked ahead, a chunk's
// rows arrive while its first keys compute (on this project's Zen 4: 10-25% off a cold chunk).
// `hint`: _MM_HINT_T1 (into L2: the whole chunk at its start) or _MM_HINT_T0 (into L1: a key group ahead).
template <typename T, int hint>
inline void prefetch_rows(const T* pool, const int64_t* slots, int64_t from, int64_t to, int64_t slot_stride,
                          int64_t h0, int64_t h1, int64_t d) {
  const int64_t bytes = (h1 - h0) * d * static_cast<int64_t>(sizeof(T));
  for (int64_t j = from; j < to; ++j) {
    const char* row = reinterpret_cast<const char*>(pool + slots[j] * slot_stride + h0 * d);
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, static_cast<_mm_hint>(hint));
  }
}

constexpr int64_t kChunk = 128;  // keys per task: a request's keys split at multiples of it (absolute positions)
constexpr int64_t kPrefetchKeys = 16;  // how far ahead of the key group in use its rows are asked for into L1
constexpr int64_t kTaskOverheadKeys = 16;  // a task's fixed work (its queries, its partial sums) in keys

// The vector path: float accumulation, D a multiple of W. Work is split into tasks of (request, chunk
// of kChunk key positions, KV heads [h0, h1)), so one request's long context keeps every thread busy. A
// task takes every KV head of its chunk where there are enough tasks for the threads: a key's K (and
// V) row of all heads is one contiguous run in the pool ([slot, KV head, D]), so the task reads whole
// runs of memory, where a task per head read a third of each run and left the rest to another thread
// (twice the time at long contexts, the pool streamed from memory). Where there are fewer than two
// chunks a thread (a short context at batch 1), each head is its own task, so the threads share evenly.
// A task takes all of its queries (a verify step's 1 + k) and the rep query heads of each KV head, so
// every K and V row of the chunk is loaded once for all of them: W keys at a time, converted to float
// once and their scores summed by `transposed_sums`, or for bfloat16 pools on AVX512_BF16 read as they
// are by the bfloat16 dot products (`attention_bf16_dot.h`: the keys transposed, the values two a step
// with the probabilities as bfloat16 pairs). Each task leaves per row its chunk's max score, sum of
// exponentials and unscaled value sum; a second pass merges a row's chunks in order (the log-sum-exp
// rescaling of split-K attention). A row's result depends only on its own keys and the chunk boundaries, not on how heads
// are grouped into tasks: a verify row equals the same token decoded, at any batch and thread count.
template <typename T>
void attend_vector(const Problem& P, const T* qp, const T* kp, const T* vp, T* op) {
  const float scale = static_cast<float>(P.scaling), cap = static_cast<float>(P.softcap);
  // rows of a request: (KV head, query t, its r-th query head) -> (kvh * Q + t) * rep + r, so a KV
  // head's Rh rows lie together
  const int64_t D = P.D, rep = P.rep, Rh = P.Q * rep, R = P.KVH * Rh;
  constexpr bool is_bf16 = std::is_same_v<T, c10::BFloat16>;
  const bool bf16_dot = W_HAS_BF16_DOT && is_bf16 && (D == 64 || D == 128);  // else the float path
  struct Task {
    int64_t g, lo, hi, h0, h1;  // key positions [lo, hi] (inclusive) of the chunk; KV heads [h0, h1)
  };
  std::vector<KeyRange> ranges(P.G * P.Q);  // the keys of query t of request g
  std::vector<Task> tasks;
  std::vector<int64_t> first(P.G + 1, 0);  // the tasks of request g: [first[g], first[g + 1])
  for (int64_t g = 0; g < P.G; ++g) {
    KeyRange all{std::numeric_limits<int64_t>::max(), -1};
    for (int64_t t = 0; t < P.Q; ++t) {
      ranges[g * P.Q + t] = key_range(P.positions[g * P.Q + t], P.lens[g], P.window);
      all = {std::min(all.lo, ranges[g * P.Q + t].lo), std::max(all.hi, ranges[g * P.Q + t].hi)};
    }
    first[g] = static_cast<int64_t>(tasks.size());
    for (int64_t c = all.lo / kChunk; c <= all.hi / kChunk; ++c) {
      tasks.push_back({g, std::max(all.lo, c * kChunk), std::min(all.hi, c * kChunk + kChunk - 1), 0, P.KVH});
    }
  }
  first[P.G] = static_cast<int64_t>(tasks.size());
  if (static_cast<int64_t>(tasks.size()) < 2 * at::get_num_threads() && P.KVH > 1) {  // a task per head
    std::vector<Task> per_head;
    for (const Task& tk : tasks) {
      for (int64_t h = 0; h < P.KVH; ++h) per_head.push_back({tk.g, tk.lo, tk.hi, h, h + 1});
    }
    tasks.swap(per_head);
  }
  const int64_t num_tasks = static_cast<int64_t>(tasks.size());
  // a chunk's partial results, at (chunk, row): chunk = the task's index where a task takes all heads
  const int64_t heads_per_task = tasks.empty() ? 1 : tasks[0].h1 - tasks[0].h0;
  const int64_t num_chunks = num_tasks * heads_per_task / P.KVH;
  std::vector<float> part_acc(num_chunks * R * D), part_max(num_chunks * R), part_sum(num_chunks * R);

  // The tasks go to torch's threads in runs of about equal work (a chunk's keys, plus a fixed part), not
  // of equal count: requests come in batch order, so an even split gave one thread the long requests'
  // chunks (Spec-Bench's 8 requests at 40 to 900 keys: one thread had 5x the other's keys).
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), num_tasks));
  std::vector<int64_t> bounds(workers + 1, num_tasks);  // worker w takes tasks [bounds[w], bounds[w + 1])
  {
    int64_t total = 0;
    for (const Task& tk : tasks) total += tk.hi - tk.lo + 1 + kTaskOverheadKeys;
    int64_t done = 0, w = 0;
    bounds[0] = 0;
    for (int64_t task = 0; task < num_tasks && w + 1 < workers; ++task) {
      done += tasks[task].hi - tasks[task].lo + 1 + kTaskOverheadKeys;
      while (w + 1 < workers && done * workers >= total * (w + 1)) bounds[++w] = task + 1;
    }
  }

  at::parallel_for(0, workers, 1, [&](int64_t first_worker, int64_t last_worker) {
    std::vector<float> scores(R * kChunk);
    std::vector<float> query(bf16_dot ? 0 : R * D), keys_f(bf16_dot ? 0 : W * D);  // scaled; W keys as float
    std::vector<c10::BFloat16> query_bf16(bf16_dot ? R * D : 0);  // unscaled
    std::vector<uint32_t> pairs(bf16_dot ? R * kChunk / 2 : 0);  // p as bfloat16 pairs
    std::vector<int64_t> slots(kChunk);
    for (int64_t task = bounds[first_worker]; task < bounds[last_worker]; ++task) {
      const Task& tk = tasks[task];
      const int64_t n = tk.hi - tk.lo + 1, chunk = task / (P.KVH / heads_per_task);
      const int64_t r0 = tk.h0 * Rh, r1 = tk.h1 * Rh;  // the task's rows
      for (int64_t kvh = tk.h0; kvh < tk.h1; ++kvh) {
        for (int64_t t = 0; t < P.Q; ++t) {
          const T* qrow = qp + ((tk.g * P.Q + t) * P.H + kvh * rep) * D;
          const int64_t first_row = (kvh * Rh + t * rep) * D;
          if constexpr (is_bf16) {
            if (bf16_dot) {
              std::copy(qrow, qrow + rep * D, query_bf16.data() + first_row);
              continue;
            }
          }
          for (int64_t i = 0; i < rep * D; ++i) query[first_row + i] = static_cast<float>(qrow[i]) * scale;
        }
      }
      const int64_t* table = P.tables + tk.g * P.max_blocks;
      for_each_key(table, P.block_size, {tk.lo, tk.hi}, [&](int64_t slot, int64_t k) { slots[k - tk.lo] = slot; });
      // scores [R, n] (rows `stride` apart): W keys at a time, each head's converted to float once for
      // its Rh rows, the heads of a key read one after another (one run of memory)
      const int64_t stride = (n + W - 1) / W * W;
      const int64_t slot_stride = P.KVH * D;
      // the chunk's rows into L2 before any is needed (they arrive while its first keys compute), the
      // keys a group ahead into L1
      prefetch_rows<T, _MM_HINT_T1>(kp, slots.data(), 0, n, slot_stride, tk.h0, tk.h1, D);
      prefetch_rows<T, _MM_HINT_T1>(vp, slots.data(), 0, n, slot_stride, tk.h0, tk.h1, D);
      prefetch_rows<T, _MM_HINT_T0>(kp, slots.data(), 0, std::min(n, kPrefetchKeys), slot_stride, tk.h0, tk.h1, D);
      for (int64_t k0 = 0; k0 < n; k0 += W) {
        const int64_t width = std::min<int64_t>(W, n - k0);
        prefetch_rows<T, _MM_HINT_T0>(kp, slots.data(), std::min(n, k0 + kPrefetchKeys),
                                      std::min(n, k0 + W + kPrefetchKeys), slot_stride, tk.h0, tk.h1, D);
        for (int64_t kvh = tk.h0; kvh < tk.h1; ++kvh) {
          const T* khead = kp + kvh * D;
          float* dots = scores.data() + kvh * Rh * stride + k0;
#if W_HAS_BF16_DOT
          if constexpr (is_bf16) {
            if (bf16_dot) {
              const c10::BFloat16* qb = query_bf16.data() + kvh * Rh * D;
              const int64_t* ks = slots.data() + k0;
              if (D == 64) {
                key_dots_bf16<64>(qb, Rh, khead, ks, width, slot_stride, scale, dots, stride);
              } else {
                key_dots_bf16<128>(qb, Rh, khead, ks, width, slot_stride, scale, dots, stride);
              }
              continue;
            }
          }
#endif
          const float* q = query.data() + kvh * Rh * D;
          if (D == 64) {
            keys_to_float<64>(khead, slots.data() + k0, width, slot_stride, D, keys_f.data());
            key_dots<64>(q, Rh, D, keys_f.data(), dots, stride);
          } else if (D == 128) {
            keys_to_float<128>(khead, slots.data() + k0, width, slot_stride, D, keys_f.data());
            key_dots<128>(q, Rh, D, keys_f.data(), dots, stride);
          } else {
            keys_to_float<0>(khead, slots.data() + k0, width, slot_stride, D, keys_f.data());
            key_dots<0>(q, Rh, D, keys_f.data(), dots, stride);
          }
        }
      }
      if (cap > 0) {
        for (int64_t i = r0 * stride; i < r1 * stride; ++i) scores[i] = std::tanh(scores[i] / cap) * cap;
      }
      // each row's softmax over its own keys in the chunk (exactly 0 elsewhere), unnormalized
      for (int64_t r = r0; r < r1; ++r) {
        float* row = scores.data() + r * stride;
        const KeyRange own = ranges[tk.g * P.Q + (r % Rh) / rep];
        const int64_t a = std::max(own.lo, tk.lo) - tk.lo, b = std::min(own.hi, tk.hi) - tk.lo + 1;  // [a, b)
        float* out_max = part_max.data() + chunk * R + r;
        float* out_sum = part_sum.data() + chunk * R + r;
        if (P.tree_bits != nullptr && a < b) {  // the step's new keys that are not this query's ancestors
          const int64_t t = (r % Rh) / rep;
          for (int64_t j = a; j < b; ++j) {
            if (tree_hides(P, tk.g, t, tk.lo + j)) row[j] = -std::numeric_limits<float>::infinity();
          }
        }
        vf vmx = vset(-std::numeric_limits<float>::infinity());
        int64_t j = a;
        for (; j + W <= b; j += W) vmx = vmax(vmx, vload(row + j));
        float m = a < b ? vmax_lanes(vmx) : -std::numeric_limits<float>::infinity();
        for (; j < b; ++j) m = std::max(m, row[j]);
        if (a >= b || m == -std::numeric_limits<float>::infinity()) {  // none of this row's keys in the chunk
          std::fill(row, row + n, 0.f);
          *out_max = -std::numeric_limits<float>::infinity();
          *out_sum = 0.f;
          continue;
        }
        std::fill(row, row + a, 0.f);
        std::fill(row + b, row + n, 0.f);
        const vf vm = vset(-m);
        vf vs = vzero();
        j = a;
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
        *out_max = m;
        *out_sum = sum;
      }
#if W_HAS_BF16_DOT
      if constexpr (is_bf16) {
        if (bf16_dot) {
          // the probabilities as bfloat16 pairs (rows stride / 2 pairs apart), for the values' dot product
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t j = 0; j < stride; j += W) {
              _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs.data() + r * (stride / 2) + j / 2),
                                  (__m256i)_mm512_cvtneps_pbh(vload(scores.data() + r * stride + j)));
            }
          }
          for (int64_t kvh = tk.h0; kvh < tk.h1; ++kvh) {
            const uint32_t* pr = pairs.data() + kvh * Rh * (stride / 2);
            float* acc = part_acc.data() + (chunk * R + kvh * Rh) * D;
            if (D == 64) {
              weighted_values_bf16<64, 6>(vp + kvh * D, slot_stride, slots.data(), n, pr, stride / 2, Rh, acc);
            } else {
              weighted_values_bf16<128, 2>(vp + kvh * D, slot_stride, slots.data(), n, pr, stride / 2, Rh, acc);
            }
          }
          continue;
        }
      }
#endif
      for (int64_t kvh = tk.h0; kvh < tk.h1; ++kvh) {
        const T* vhead = vp + kvh * D;
        const float* p = scores.data() + kvh * Rh * stride;
        float* acc = part_acc.data() + (chunk * R + kvh * Rh) * D;
        if (D == 64) {
          weighted_values<64, (W == 16 ? 4 : 2)>(vhead, slot_stride, slots.data(), n, p, stride, Rh, acc);
        } else if (D == 128) {
          weighted_values<128, (W == 16 ? 2 : 1)>(vhead, slot_stride, slots.data(), n, p, stride, Rh, acc);
        } else {
          std::fill(acc, acc + Rh * D, 0.f);
          for (int64_t k = 0; k < n; ++k) {
            const T* vrow = vhead + slots[k] * slot_stride;
            for (int64_t i = 0; i < D; i += W) {
              const vf vv = vload(vrow + i);
              for (int64_t r = 0; r < Rh; ++r) {
                float* a = acc + r * D + i;
                vstore(a, vfma(vset(p[r * stride + k]), vv, vload(a)));
              }
            }
          }
        }
      }
    }
  });

  // merge each row's chunks in order: out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c
  at::parallel_for(0, P.G * P.KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> merged(D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t g = i / P.KVH, kvh = i % P.KVH;
      // request g's chunks: [first[g], first[g + 1]) in the list before any split by head
      for (int64_t row = kvh * Rh; row < (kvh + 1) * Rh; ++row) {
        float M = -std::numeric_limits<float>::infinity();
        for (int64_t c = first[g]; c < first[g + 1]; ++c) M = std::max(M, part_max[c * R + row]);
        float total = 0.f;
        std::fill(merged.begin(), merged.end(), 0.f);
        for (int64_t c = first[g]; c < first[g + 1]; ++c) {
          if (part_sum[c * R + row] == 0.f) continue;
          const float w = std::exp(part_max[c * R + row] - M);  // exactly 1 for the max's chunk
          total += w * part_sum[c * R + row];
          const float* acc = part_acc.data() + (c * R + row) * D;
          for (int64_t d = 0; d < D; d += W) vstore(merged.data() + d, vfma(vset(w), vload(acc + d), vload(merged.data() + d)));
        }
        const int64_t t = (row % Rh) / rep, r = row % rep;
        T* orow = op + ((g * P.Q + t) * P.H + kvh * rep + r) * D;
        const float inv = 1.f / total;
        for (int64_t d = 0; d < D; ++d) orow[d] = static_cast<T>(merged[d] * inv);
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

// Every page a request's keys are read from lies in the pool, as torch's page gather checks its indices:
// request g reads blocks [0, ceil(max(kv_lens[g], 1) / block_size)) of its table (a request of no keys
// attends key 0), slots table[g][b] * block_size .. + block_size - 1. One pass over the small index
// tensors (long, contiguous) before anything is read.
void check_pages(const at::Tensor& block_tables, const at::Tensor& kv_lens, int64_t block_size, int64_t slots) {
  const int64_t G = block_tables.size(0), max_blocks = block_tables.size(1), pages = slots / block_size;
  TORCH_CHECK(G == 0 || max_blocks > 0, "paged_attention_short: block_tables [G, max_blocks] has no pages");
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = kv_lens.data_ptr<int64_t>();
  for (int64_t g = 0; g < G; ++g) {
    const int64_t blocks = lens[g] / block_size + (lens[g] % block_size != 0);  // (no overflow for any length)
    TORCH_CHECK(lens[g] >= 0 && blocks <= max_blocks, "paged_attention_short: kv_lens[", g, "] = ", lens[g],
                " is out of range: its block table holds ", max_blocks, " pages of ", block_size, " keys");
    for (int64_t b = 0; b < std::max<int64_t>(blocks, 1); ++b) {
      const int64_t page = tables[g * max_blocks + b];
      TORCH_CHECK(page >= 0 && page < pages, "paged_attention_short: block_tables[", g, ", ", b, "] = ", page,
                  " is out of range: the pool holds ", pages, " pages of ", block_size, " slots");
    }
  }
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
    double softcap,
    std::optional<at::Tensor> tree_bits) {  // [G, Q] or None
  TORCH_CHECK(q.dim() == 4 && kv.dim() == 4 && kv.size(0) == 2, "q [G, Q, H, D], kv [2, slots, KVH, D]");
  TORCH_CHECK(kv.size(2) > 0 && q.size(3) == kv.size(3) && q.size(2) % kv.size(2) == 0, "head shapes do not fit");
  TORCH_CHECK(q.scalar_type() == kv.scalar_type(), "q and kv must share a dtype");
  TORCH_CHECK(kv.is_contiguous(), "the KV pool must be contiguous");
  const int64_t G = q.size(0), Q = q.size(1);
  TORCH_CHECK(block_size > 0, "paged_attention_short: block_size must be positive, got ", block_size);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == G,
              "paged_attention_short: block_tables must be [G, max_blocks] with G = ", G, ", got ", block_tables.sizes());
  TORCH_CHECK(query_pos.dim() == 2 && query_pos.size(0) == G && query_pos.size(1) == Q,
              "paged_attention_short: query_pos must be [G, Q] = [", G, ", ", Q, "], got ", query_pos.sizes());
  TORCH_CHECK(kv_lens.dim() == 1 && kv_lens.size(0) == G, "paged_attention_short: kv_lens must be [G] = [", G,
              "], got ", kv_lens.sizes());
  q = q.contiguous();
  block_tables = block_tables.to(at::kLong).contiguous();
  query_pos = query_pos.to(at::kLong).contiguous();
  kv_lens = kv_lens.to(at::kLong).contiguous();
  check_pages(block_tables, kv_lens, block_size, kv.size(1));
  if (tree_bits.has_value()) {
    TORCH_CHECK(tree_bits->dim() == 2 && tree_bits->size(0) == G && tree_bits->size(1) == Q,
                "paged_attention_short: tree_bits must be [G, Q] = [", G, ", ", Q, "], got ", tree_bits->sizes());
    tree_bits = tree_bits->to(at::kLong).contiguous();
  }
  auto out = at::empty_like(q);
  const Problem P{
      q.size(0), q.size(1), q.size(2), q.size(3), kv.size(2), kv.size(1), block_tables.size(1),
      q.size(2) / kv.size(2), block_size, window, scaling, softcap,
      block_tables.data_ptr<int64_t>(), query_pos.data_ptr<int64_t>(), kv_lens.data_ptr<int64_t>(),
      tree_bits.has_value() ? tree_bits->data_ptr<int64_t>() : nullptr};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention_short", [&] {
    const scalar_t* kp = kv.data_ptr<scalar_t>();
    attend<scalar_t>(P, q.data_ptr<scalar_t>(), kp, kp + P.slots * P.KVH * P.D, out.data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(specexec_cpu, m) {
  // the schema spelt out for tree_bits' default: callers without token trees leave it out
  m.def(
      "paged_attention_short(Tensor q, Tensor kv, Tensor block_tables, Tensor query_pos, Tensor kv_lens, "
      "int block_size, float scaling, int window, float softcap, Tensor? tree_bits=None) -> Tensor",
      &paged_attention_short);
}
