// Each logit row's verification summary, in one pass over the row on the CPU's vector unit: its status
// (0 readable, 1 holds NaN, 2 its max is +inf, 3 every entry is -inf: `sampling.rejection.ROW_STATUS`)
// and its argmax (the first index of its max, as torch.max gives it; for a NaN row the first NaN's).
// out[r] = (status, argmax), long. torch's max over a 49,152-entry bfloat16 row took 78 us on the
// 2-core Zen 4, and the status four more ops; this takes a few microseconds.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "attention_vectors.h"

namespace {

using namespace specexec_attention;

// the row's max over its non-NaN entries, and whether it holds a NaN
template <typename T>
inline float max_and_nan(const T* row, int64_t n, bool* has_nan) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  bool nan = false;
#if W_HAS_VECTORS
  vf vm = vset(m);
#if defined(__AVX512F__)
  __mmask16 nan_lanes = 0;
#else
  vf nan_lanes = vzero();
#endif
  for (; i + W <= n; i += W) {
    const vf x = vload(row + i);
    vm = vmax(x, vm);  // maxps gives its second operand where the first is NaN: NaN never enters vm
#if defined(__AVX512F__)
    nan_lanes |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
#else
    nan_lanes = _mm256_or_ps(nan_lanes, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
#endif
  }
  m = vmax_lanes(vm);
#if defined(__AVX512F__)
  nan = nan_lanes != 0;
#else
  nan = _mm256_movemask_ps(nan_lanes) != 0;
#endif
#endif
  for (; i < n; ++i) {
    const float x = static_cast<float>(row[i]);
    if (std::isnan(x)) {
      nan = true;
    } else if (x > m) {
      m = x;
    }
  }
  *has_nan = nan;
  return m;
}

// the first index whose entry equals m (one that does)
template <typename T>
inline int64_t first_equal(const T* row, int64_t n, float m) {
  int64_t i = 0;
#if W_HAS_VECTORS
  const vf vm = vset(m);
  for (; i + W <= n; i += W) {
#if defined(__AVX512F__)
    const __mmask16 hit = _mm512_cmp_ps_mask(vload(row + i), vm, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
#else
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(vload(row + i), vm, _CMP_EQ_OQ));
    if (hit) return i + __builtin_ctz(hit);
#endif
  }
#endif
  while (static_cast<float>(row[i]) != m) ++i;
  return i;
}

template <typename T>
void summarize(const T* logits, int64_t rows, int64_t n, int64_t stride, int64_t* out) {
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* row = logits + r * stride;
      bool nan = false;
      const float m = max_and_nan(row, n, &nan);
      int64_t status = 0, index = 0;
      if (nan) {
        status = 1;
        while (!std::isnan(static_cast<float>(row[index]))) ++index;
      } else {
        status = m == std::numeric_limits<float>::infinity() ? 2 : m == -std::numeric_limits<float>::infinity() ? 3 : 0;
        index = first_equal(row, n, m);
      }
      out[2 * r] = status;
      out[2 * r + 1] = index;
    }
  });
}

at::Tensor row_status_argmax(at::Tensor logits) {  // [rows, vocab] float, bfloat16 or float16 -> [rows, 2] long
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0, "logits must be [rows, vocab] with vocab > 0");
  if (logits.stride(1) != 1) logits = logits.contiguous();
  auto out = at::empty({logits.size(0), 2}, logits.options().dtype(at::kLong));
  const int64_t rows = logits.size(0), n = logits.size(1), stride = logits.stride(0);
  int64_t* o = out.data_ptr<int64_t>();
  switch (logits.scalar_type()) {
    case at::kFloat: summarize(logits.data_ptr<float>(), rows, n, stride, o); break;
    case at::kBFloat16: summarize(logits.data_ptr<c10::BFloat16>(), rows, n, stride, o); break;
    case at::kHalf: summarize(logits.data_ptr<c10::Half>(), rows, n, stride, o); break;
    default: TORCH_CHECK(false, "row_status_argmax takes float32, bfloat16 or float16 logits, not ", logits.scalar_type());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specexec_cpu, m) {
  m.def("row_status_argmax", &row_status_argmax);
}
