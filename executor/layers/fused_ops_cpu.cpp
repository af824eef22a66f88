// Fused CPU ops of the own decoder's layers, each one pass over its rows where torch takes several ops:
//
// - add_rms_norm: optionally residual += x first (in the input dtype, as transformers adds), then RMSNorm
//   computed in float: Llama's convention weight * (x * rsqrt(mean(x^2) + eps)).to(dtype), or Gemma's
//   ((x * rsqrt(...)) * (1 + weight)).to(dtype);
// - rotary_kv_write: RoPE on the q and k heads of a fused QKV row (x * cos + swap_halves(x) * signed sin,
//   the table's rows), K and V written into one layer's KV pool at the rows' slots (each checked to lie
//   in the pool first); returns q rotated;
// - act_mul: act(gate) * up over a fused gate/up row (SiLU, or GELU's tanh form), each rounded to the
//   dtype as torch's two ops round.
// float32, bfloat16 and float16; rows split over torch's threads.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "float_convert.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

namespace {

using specexec_convert::widen;
using specexec_convert::round_to;
using specexec_convert::put;

// sum of v[i]^2 over n floats, in 16 partial sums (so that it vectorizes; float addition is not
// associative, so GCC keeps a single sum's order otherwise)
inline float sum_of_squares(const float* v, int64_t n) {
  float partial[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) partial[j] += v[i + j] * v[i + j];
  }
  for (; i < n; ++i) partial[i % 16] += v[i] * v[i];
  float total = 0.f;
  for (int j = 0; j < 16; ++j) total += partial[j];
  return total;
}

// out [T, D], residual [T, D] (its sum with x when given, else x itself: returned as the new residual)
std::tuple<at::Tensor, at::Tensor> add_rms_norm(
    at::Tensor x, std::optional<at::Tensor> residual, at::Tensor weight, double eps, bool unit_offset) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && x.size(1) == weight.size(0), "x [T, D], weight [D]");
  TORCH_CHECK(!residual.has_value() || residual->sizes() == x.sizes(), "add_rms_norm: residual must be x's shape ",
              x.sizes(), ", got ", residual.has_value() ? residual->sizes() : x.sizes());
  x = x.contiguous();
  weight = weight.contiguous();
  const at::Tensor res = residual.has_value() ? residual->contiguous() : x;
  at::Tensor sum = residual.has_value() ? at::empty_like(x) : x;
  at::Tensor out = at::empty_like(x);
  const int64_t T = x.size(0), D = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    using T_ = scalar_t;
    const T_* xp = x.data_ptr<T_>();
    const T_* rp = residual.has_value() ? res.data_ptr<T_>() : nullptr;
    const T_* wp = weight.data_ptr<T_>();
    T_* sp = sum.data_ptr<T_>();
    T_* op = out.data_ptr<T_>();
    at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> row(D), w(D);
      for (int64_t i = 0; i < D; ++i) w[i] = widen(wp + i);
      for (int64_t t = begin; t < end; ++t) {
        const T_* xr = xp + t * D;
        if (rp != nullptr) {
          const T_* rr = rp + t * D;
          T_* sr = sp + t * D;
          for (int64_t i = 0; i < D; ++i) {
            const float v = round_to<T_>(widen(xr + i) + widen(rr + i));  // the add, rounded to the dtype
            put(sr + i, v);
            row[i] = v;
          }
        } else {
          for (int64_t i = 0; i < D; ++i) row[i] = widen(xr + i);
        }
        const float scale =
            1.f / std::sqrt(sum_of_squares(row.data(), D) / static_cast<float>(D) + static_cast<float>(eps));
        T_* orow = op + t * D;
        if (unit_offset) {
          for (int64_t i = 0; i < D; ++i) put(orow + i, row[i] * scale * (1.f + w[i]));
        } else {
          for (int64_t i = 0; i < D; ++i) put(orow + i, w[i] * round_to<T_>(row[i] * scale));
        }
      }
    });
  });
  return {out, sum};
}

// qkv [T, (H + 2 KV) * D]; rows [T, 2, 1, D] (cos, signed sin); kv [2, slots, KV, D]; slots [T]
at::Tensor rotary_kv_write(
    at::Tensor qkv, at::Tensor rows, at::Tensor kv, at::Tensor slots, int64_t H, int64_t KV, int64_t D) {
  TORCH_CHECK(H > 0 && KV > 0 && D > 0 && D % 2 == 0, "rotary_kv_write: head counts and an even head size, got H ",
              H, ", KV ", KV, ", D ", D);
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == (H + 2 * KV) * D, "qkv [T, (H + 2 KV) * D]");
  TORCH_CHECK(kv.dim() == 4 && kv.size(0) == 2 && kv.is_contiguous() && kv.size(2) == KV && kv.size(3) == D,
              "kv [2, slots, KV, D], contiguous");
  TORCH_CHECK(qkv.scalar_type() == kv.scalar_type() && rows.scalar_type() == qkv.scalar_type(), "one dtype");
  const int64_t T = qkv.size(0), num_slots = kv.size(1), half = D / 2;
  TORCH_CHECK(rows.dim() >= 1 && rows.size(0) == T && rows.numel() == T * 2 * D,
              "rotary_kv_write: rows must be [T, 2, 1, D] = [", T, ", 2, 1, ", D, "], got ", rows.sizes());
  TORCH_CHECK(slots.dim() == 1 && slots.size(0) == T, "rotary_kv_write: slots must be [T] = [", T, "], got ",
              slots.sizes());
  qkv = qkv.contiguous();
  rows = rows.contiguous();
  slots = slots.to(at::kLong).contiguous();
  // every slot in the pool before anything is written, as torch's index_copy_ checks (one pass over T)
  const int64_t* slot_of = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t slot = slot_of[t];
    TORCH_CHECK(slot >= 0 && slot < num_slots, "rotary_kv_write: slots[", t, "] = ", slot,
                " is out of range: the pool holds ", num_slots, " slots");
  }
  at::Tensor q = at::empty({T, H, D}, qkv.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rotary_kv_write", [&] {
    using T_ = scalar_t;
    const T_* xp = qkv.data_ptr<T_>();
    const T_* cp = rows.data_ptr<T_>();
    const int64_t* sp = slots.data_ptr<int64_t>();
    T_* qp = q.data_ptr<T_>();
    T_* kp = kv.data_ptr<T_>();
    T_* vp = kp + num_slots * KV * D;
    // a token's heads are one task's (a few microseconds); tokens split over torch's threads
    at::parallel_for(0, T, 4, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const T_* cos = cp + t * 2 * D;
        const T_* sin = cos + D;
        for (int64_t h = 0; h < H + KV; ++h) {
          const T_* in = xp + t * (H + 2 * KV) * D + h * D;
          T_* dst = h < H ? qp + (t * H + h) * D : kp + (sp[t] * KV + (h - H)) * D;
          // transformers: (x * cos) + (rotate_half(x) * sin), each product rounded to the dtype; the two
          // halves apart, so that neither loop branches on its index
          for (int64_t i = 0; i < half; ++i) {
            const float a = round_to<T_>(widen(in + i) * widen(cos + i));
            const float b = round_to<T_>(widen(in + i + half) * widen(sin + i));
            put(dst + i, a + b);
          }
          for (int64_t i = half; i < D; ++i) {
            const float a = round_to<T_>(widen(in + i) * widen(cos + i));
            const float b = round_to<T_>(widen(in + i - half) * widen(sin + i));
            put(dst + i, a + b);
          }
          if (h >= H) {  // its V head goes in beside it, unrotated
            const T_* v = xp + t * (H + 2 * KV) * D + (H + KV + (h - H)) * D;
            std::memcpy(vp + (sp[t] * KV + (h - H)) * D, v, D * sizeof(T_));
          }
        }
      }
    });
  });
  return q;
}

// e^x in float for the activations: the attention kernel's range reduction and polynomial (relative error
// about 2e-7), written as plain arithmetic so that GCC vectorizes a loop of it (std::exp does not vectorize:
// a libm call per element, which made act_mul 12 ns an element)
inline float exp_poly(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);  // 2^n stays a normal float
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = std::fma(n, -1.42860677e-6f, std::fma(n, -0.693145752f, x));
  float p = 1.f / 720;
  p = std::fma(p, r, 1.f / 120);
  p = std::fma(p, r, 1.f / 24);
  p = std::fma(p, r, 1.f / 6);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.f);
  p = std::fma(p, r, 1.f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

inline float silu(float g) { return g / (1.f + exp_poly(-g)); }

inline float gelu_tanh(float g) {  // tanh(z) = 1 - 2 / (e^(2z) + 1)
  const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
  return 0.5f * g * (2.f - 2.f / (exp_poly(2.f * inner) + 1.f));
}

// One row's act(gate) * up, `n` elements, in chunks whose float work vectorizes; the activation is rounded
// to the dtype before the product, as torch's two ops round.
template <typename T_>
void act_mul_row(const T_* gate, const T_* up, T_* out, int64_t n, int64_t act) {
  constexpr int64_t kChunk = 64;
  float g[kChunk], a[kChunk];
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t len = std::min(kChunk, n - start);
    for (int64_t i = 0; i < len; ++i) {
      g[i] = widen(gate + start + i);
    }
    if (act == 0) {
      for (int64_t i = 0; i < len; ++i) a[i] = silu(g[i]);
    } else {
      for (int64_t i = 0; i < len; ++i) a[i] = gelu_tanh(g[i]);
    }
    for (int64_t i = 0; i < len; ++i) {
      put(out + start + i, round_to<T_>(a[i]) * widen(up + start + i));
    }
  }
}

template <>
void act_mul_row<double>(const double* gate, const double* up, double* out, int64_t n, int64_t act) {
  for (int64_t i = 0; i < n; ++i) {  // double keeps libm's exp and tanh
    const double g = gate[i];
    const double a = act == 0 ? g / (1.0 + std::exp(-g))
                              : 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
    out[i] = a * up[i];
  }
}

// gate_up [T, 2 I] -> act(gate) * up [T, I]; act 0: SiLU, 1: GELU (tanh form). Rows split over torch's
// threads, and a row's chunks too where there are few rows.
at::Tensor act_mul(at::Tensor gate_up, int64_t act) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "gate_up [T, 2 I]");
  gate_up = gate_up.contiguous();
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  at::Tensor out = at::empty({T, I}, gate_up.options());
  constexpr int64_t kPiece = 1024;  // elements a task takes at the least
  const int64_t pieces = (I + kPiece - 1) / kPiece;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "act_mul", [&] {
    using T_ = scalar_t;
    const T_* gp = gate_up.data_ptr<T_>();
    T_* op = out.data_ptr<T_>();
    at::parallel_for(0, T * pieces, 4, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t t = task / pieces, start = (task % pieces) * kPiece;
        const int64_t len = std::min(kPiece, I - start);
        act_mul_row<T_>(gp + t * 2 * I + start, gp + t * 2 * I + I + start, op + t * I + start, len, act);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specexec_cpu, m) {
  m.def("add_rms_norm", &add_rms_norm);
  m.def("rotary_kv_write", &rotary_kv_write);
  m.def("act_mul", &act_mul);
}
