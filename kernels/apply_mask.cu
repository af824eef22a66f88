// Grammar-mask kernel for guided decoding (xgrammar-style packed token bitmasks).
//
// Self-contained: no torch headers. Compiled at run time by NVRTC through CuPy
// (kernels/apply_mask_cupy.py, with name expressions for the three instantiations) and
// ahead of time by nvcc in tests/test_mask_kernels.py (with -DSPECEXEC_NVCC_CHECK, which
// turns on the explicit instantiations at the bottom of this file).
//
// Semantics, per row r of logits [num_rows, vocab] (row r starts at logits + r * row_stride,
// columns are contiguous):
//   * needs_mask[r] == 0: the row is left untouched (the block returns at once).
//     needs_mask == nullptr: every row is masked.
//   * column c maps to the token t = c, or t = c + d2t[c] when a draft-to-target table is
//     given (EAGLE-3 convention: draft logits masked by the target's bitmask).
//   * t is allowed iff 0 <= t < mask_vocab and bit (t % 32) of word bitmask[r][t / 32] is
//     set. Everything else (disallowed tokens, padding columns at or past mask_vocab, d2t
//     targets out of range) becomes -inf. Bits at or past the logits width are never read
//     without d2t. The host guarantees mask_vocab <= 32 * words_per_row.
//
// Launch: grid = (column blocks, num_rows), block = 256 threads. The column loop is a
// grid-stride loop, so any grid.x is correct; the host picks grid.x so that every thread
// handles a few columns. Consecutive threads handle consecutive columns, so the stores are
// coalesced and the 32 threads of a warp share one bitmask word (a broadcast load).
// Logits are never read: disallowed entries are overwritten, allowed ones are not touched.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace specexec_kernels {

// Negative infinity of each logits type, built from its bit pattern.
template <typename T>
struct NegInf;

template <>
struct NegInf<float> {
  static __device__ __forceinline__ float value() { return __uint_as_float(0xff800000u); }
};

template <>
struct NegInf<__half> {
  static __device__ __forceinline__ __half value() {
    return __ushort_as_half(static_cast<unsigned short>(0xfc00u));
  }
};

template <>
struct NegInf<__nv_bfloat16> {
  static __device__ __forceinline__ __nv_bfloat16 value() {
    return __ushort_as_bfloat16(static_cast<unsigned short>(0xff80u));
  }
};

}  // namespace specexec_kernels

// `long long` / `int` rather than int64_t / int32_t: NVRTC has no <cstdint> by default.
template <typename T>
__global__ void __launch_bounds__(256) apply_mask_kernel(
    T* __restrict__ logits,                 // [num_rows, row_stride], first `vocab` columns used
    long long row_stride,                   // elements between the starts of two rows
    const int* __restrict__ bitmask,        // [num_rows, words_per_row], contiguous
    int words_per_row,                      // ceil(mask vocab / 32) or more
    const int* __restrict__ needs_mask,     // [num_rows] or nullptr (= mask every row)
    const long long* __restrict__ d2t,      // [vocab] draft -> target offsets, or nullptr
    int vocab,                              // logits width (draft vocab with d2t)
    int mask_vocab,                         // tokens covered by the bitmask (<= 32 * words_per_row)
    int num_rows) {
  const int row = blockIdx.y;
  if (row >= num_rows) return;
  if (needs_mask != nullptr && needs_mask[row] == 0) return;

  T* __restrict__ row_logits = logits + static_cast<long long>(row) * row_stride;
  const int* __restrict__ row_mask = bitmask + static_cast<long long>(row) * words_per_row;
  const T neg_inf = specexec_kernels::NegInf<T>::value();

  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long col = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; col < vocab;
       col += step) {
    const long long token = (d2t == nullptr) ? col : col + d2t[col];
    bool allowed = false;
    if (token >= 0 && token < mask_vocab) {
      const unsigned int word = static_cast<unsigned int>(row_mask[token >> 5]);
      allowed = ((word >> static_cast<unsigned int>(token & 31)) & 1u) != 0u;
    }
    if (!allowed) row_logits[col] = neg_inf;
  }
}

#ifdef SPECEXEC_NVCC_CHECK
// Ahead-of-time instantiations so that `nvcc -ptx` emits the three kernels (NVRTC gets them
// from name expressions instead).
#define SPECEXEC_INSTANTIATE_APPLY_MASK(T)                                                  \
  template __global__ void apply_mask_kernel<T>(T*, long long, const int*, int, const int*, \
                                                const long long*, int, int, int);
SPECEXEC_INSTANTIATE_APPLY_MASK(float)
SPECEXEC_INSTANTIATE_APPLY_MASK(__half)
SPECEXEC_INSTANTIATE_APPLY_MASK(__nv_bfloat16)
#undef SPECEXEC_INSTANTIATE_APPLY_MASK
#endif  // SPECEXEC_NVCC_CHECK
