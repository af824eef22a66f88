// Fused CPU ops of the own decoder's layers, each one pass over its rows where torch takes several ops:
//
// - add_rms_norm: optionally residual += x first (in the input dtype, as transformers adds), then RMSNorm
//   computed in float: Llama's convention weight * (x * rsqrt(mean(x^2) + eps)).to(dtype), or Gemma's
//   ((x * rsqrt(...)) * (1 + weight)).to(dtype);
// - rotary_kv_write: RoPE on the q and k heads of a fused QKV row (x * cos + swap_halves(x) * signed sin,
//   the table's rows), K and V written into one layer's KV pool at the rows' slots; returns q rotated;
// - act_mul: act(gate) * up over a fused gate/up row (SiLU, or GELU's tanh form), each rounded to the
//   dtype as torch's two ops round.
// float32, bfloat16 and float16; rows split over torch's threads.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

namespace {

template <typename T>
inline float f(T x) {
  return static_cast<float>(x);
}

// out [T, D], residual [T, D] (its sum with x when given, else x itself: returned as the new residual)
std::tuple<at::Tensor, at::Tensor> add_rms_norm(
    at::Tensor x, std::optional<at::Tensor> residual, at::Tensor weight, double eps, bool unit_offset) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && x.size(1) == weight.size(0), "x [T, D], weight [D]");
  x = x.contiguous();
  weight = weight.contiguous();
  at::Tensor sum = residual.has_value() ? at::empty_like(x) : x;
  at::Tensor out = at::empty_like(x);
  const int64_t T = x.size(0), D = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    using T_ = scalar_t;
    const T_* xp = x.data_ptr<T_>();
    const T_* rp = residual.has_value() ? residual->contiguous().data_ptr<T_>() : nullptr;
    const T_* wp = weight.data_ptr<T_>();
    T_* sp = sum.data_ptr<T_>();
    T_* op = out.data_ptr<T_>();
    at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> row(D);
      for (int64_t t = begin; t < end; ++t) {
        float squares = 0.f;
        for (int64_t i = 0; i < D; ++i) {
          T_ v = xp[t * D + i];
          if (rp != nullptr) {
            v = static_cast<T_>(f(v) + f(rp[t * D + i]));  // the add, rounded to the dtype
            sp[t * D + i] = v;
          }
          row[i] = f(v);
          squares += row[i] * row[i];
        }
        const float scale = 1.f / std::sqrt(squares / static_cast<float>(D) + static_cast<float>(eps));
        for (int64_t i = 0; i < D; ++i) {
          if (unit_offset) {
            op[t * D + i] = static_cast<T_>(row[i] * scale * (1.f + f(wp[i])));
          } else {
            op[t * D + i] = static_cast<T_>(f(wp[i]) * f(static_cast<T_>(row[i] * scale)));
          }
        }
      }
    });
  });
  return {out, sum};
}

// qkv [T, (H + 2 KV) * D]; rows [T, 2, 1, D] (cos, signed sin); kv [2, slots, KV, D]; slots [T]
at::Tensor rotary_kv_write(
    at::Tensor qkv, at::Tensor rows, at::Tensor kv, at::Tensor slots, int64_t H, int64_t KV, int64_t D) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == (H + 2 * KV) * D, "qkv [T, (H + 2 KV) * D]");
  TORCH_CHECK(kv.is_contiguous() && kv.size(2) == KV && kv.size(3) == D, "kv [2, slots, KV, D], contiguous");
  TORCH_CHECK(qkv.scalar_type() == kv.scalar_type() && rows.scalar_type() == qkv.scalar_type(), "one dtype");
  qkv = qkv.contiguous();
  rows = rows.contiguous();
  slots = slots.to(at::kLong).contiguous();
  const int64_t T = qkv.size(0), num_slots = kv.size(1), half = D / 2;
  at::Tensor q = at::empty({T, H, D}, qkv.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rotary_kv_write", [&] {
    using T_ = scalar_t;
    const T_* xp = qkv.data_ptr<T_>();
    const T_* cp = rows.data_ptr<T_>();
    const int64_t* sp = slots.data_ptr<int64_t>();
    T_* qp = q.data_ptr<T_>();
    T_* kp = kv.data_ptr<T_>();
    T_* vp = kp + num_slots * KV * D;
    at::parallel_for(0, T * (H + KV), 8, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t t = task / (H + KV), h = task % (H + KV);
        const T_* in = xp + t * (H + 2 * KV) * D + h * D;
        const T_* cos = cp + t * 2 * D;
        const T_* sin = cos + D;
        T_* dst = h < H ? qp + (t * H + h) * D : kp + (sp[t] * KV + (h - H)) * D;
        for (int64_t i = 0; i < D; ++i) {
          const float swapped = f(in[i < half ? i + half : i - half]);
          // transformers: (x * cos) + (rotate_half(x) * sin), each product rounded to the dtype
          const T_ a = static_cast<T_>(f(in[i]) * f(cos[i]));
          const T_ b = static_cast<T_>(swapped * f(sin[i]));
          dst[i] = static_cast<T_>(f(a) + f(b));
        }
        if (h >= H) {  // its V head goes in beside it, unrotated
          const T_* v = xp + t * (H + 2 * KV) * D + (H + KV + (h - H)) * D;
          T_* vdst = vp + (sp[t] * KV + (h - H)) * D;
          for (int64_t i = 0; i < D; ++i) {
            vdst[i] = v[i];
          }
        }
      }
    });
  });
  return q;
}

// gate_up [T, 2 I] -> act(gate) * up [T, I]; act 0: SiLU, 1: GELU (tanh form)
at::Tensor act_mul(at::Tensor gate_up, int64_t act) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "gate_up [T, 2 I]");
  gate_up = gate_up.contiguous();
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  at::Tensor out = at::empty({T, I}, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "act_mul", [&] {
    using T_ = scalar_t;
    const T_* gp = gate_up.data_ptr<T_>();
    T_* op = out.data_ptr<T_>();
    at::parallel_for(0, T * I, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const int64_t t = k / I, i = k % I;
        const float g = f(gp[t * 2 * I + i]);
        float a;
        if (act == 0) {
          a = g / (1.f + std::exp(-g));
        } else {
          const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
          a = 0.5f * g * (1.f + std::tanh(inner));
        }
        op[k] = static_cast<T_>(f(static_cast<T_>(a)) * f(gp[t * 2 * I + I + i]));
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
