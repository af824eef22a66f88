"""A linear layer over a few rows as one Triton kernel, optionally with the RMSNorm before it: the decode
and verify steps' projections on CUDA.

At one to sixteen rows a projection reads every weight once and does almost no arithmetic, so its time
is the weight bytes over the memory bandwidth the kernel reaches. cuBLAS's kernels for those shapes
reached about 2.1 TB/s of an H100's 3.0 (copy bandwidth) in Llama-3-8B's decode step (the
gpu-own-decoder report). This kernel streams the weight in ``[BLOCK_N, BLOCK_K]`` tiles, ``NUM_STAGES``
loads in flight, and multiplies each tile with the rows on the tensor cores (the rows padded to 16);
``SPLIT_K`` programs share one output tile's K when there are too few tiles of N to keep every SM
busy, and a second launch sums their float32 partials in a fixed order (no atomics: the result does
not change between runs). With a norm, every program first reads the rows (x + residual: a few KB,
from L2) for their RMS, then normalizes each tile before its product: the residual add, the norm and
the projection in one launch where the unfused layer takes two (`fused_ops.add_rms_norm`, then the
GEMM).

`SkinnyConfig` is one choice of tile sizes; which config runs, or whether cuBLAS does, is measured per
weight shape (`skinny_linear.py`). Numbers: float32 accumulation, one rounding to the output dtype,
as cuBLAS; the sum's order differs from cuBLAS's, so the last bit may.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_ROWS = 16  #: the rows one launch takes (the tensor cores' smallest M)
#: the dtypes it takes (float32 stays on cuBLAS: a float32 product on the tensor cores would be TF32)
SKINNY_DTYPES = (torch.bfloat16, torch.float16)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True, slots=True)
class SkinnyConfig:
    """The tile sizes and pipelining of one launch."""

    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4

    def describe(self) -> str:
        return f"n{self.block_n}k{self.block_k}s{self.split_k}w{self.num_warps}p{self.num_stages}"


#: the configs tried (`skinny_tune.py` in the 2026-11-28-gpu-step report)
CANDIDATES = tuple(
    SkinnyConfig(n, k, s, w, p)
    for n, k in ((32, 256), (64, 128), (64, 256), (128, 128))
    for s in (1, 2, 4)
    for w, p in ((4, 4), (8, 3))
)
#: the configs the start-up measurement tries (`skinny_linear.py`): those that won a case of
#: `CANDIDATES` on an H200 (cuBLAS against all 24, Llama-3-8B's and SmolLM2's shapes at 1-16 rows)
MEASURED = (
    SkinnyConfig(32, 256, 1, 4, 4), SkinnyConfig(64, 128, 1, 4, 4), SkinnyConfig(64, 256, 1, 4, 4),
    SkinnyConfig(64, 256, 2, 4, 4), SkinnyConfig(64, 128, 4, 4, 4), SkinnyConfig(128, 128, 4, 4, 4),
    SkinnyConfig(128, 128, 1, 8, 3),
)  # fmt: skip


@triton.jit
def _skinny_gemm_kernel(
    x_ptr, res_ptr, norm_w_ptr, total_ptr, w_ptr, out_ptr, M, N, K, eps, offset,
    stride_xm, stride_wn, stride_om, stride_os, K_PER_SPLIT,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    if NORM:  # the rows' RMS over all of K first (x is tiny: every program reads it from L2)
        squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + ks
            at = rows[:, None] * stride_xm + k[None, :]
            ok = row_ok[:, None] & (k[None, :] < K)
            x = tl.load(x_ptr + at, mask=ok, other=0.0)
            if HAS_RESIDUAL:  # the residual add, rounded to the dtype as the unfused op rounds it
                x = (x.to(tl.float32) + tl.load(res_ptr + at, mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
                if (pid_n == 0) & (pid_k == 0):
                    tl.store(total_ptr + at, x, mask=ok)
            t = x.to(tl.float32)
            squares += tl.sum(t * t, axis=1)
        rstd = 1.0 / tl.sqrt(squares / K + eps)  # [BLOCK_M]
    k_start = pid_k * K_PER_SPLIT
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(k_start, k_start + K_PER_SPLIT, BLOCK_K, num_stages=NUM_STAGES):
        k = k0 + ks
        k_ok = k < K
        w = tl.load(  # [BLOCK_N, BLOCK_K]
            w_ptr + cols[:, None].to(tl.int64) * stride_wn + k[None, :],
            mask=(cols[:, None] < N) & k_ok[None, :],
            other=0.0,
        )
        at = rows[:, None] * stride_xm + k[None, :]
        ok = row_ok[:, None] & k_ok[None, :]
        x = tl.load(x_ptr + at, mask=ok, other=0.0)  # [BLOCK_M, BLOCK_K]
        if NORM:  # norm(x) * weight, rounded to the dtype: the unfused norm's output
            if HAS_RESIDUAL:
                x = (x.to(tl.float32) + tl.load(res_ptr + at, mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
            scale = tl.load(norm_w_ptr + k, mask=k_ok, other=0.0).to(tl.float32) + offset
            x = (x.to(tl.float32) * rstd[:, None] * scale[None, :]).to(w.dtype)
        if UPCAST:  # Triton's interpreter multiplies half-precision tiles wrongly: float32 there
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:  # half-precision products are exact in the float32 accumulator
            acc = tl.dot(x, tl.trans(w), acc)
    out = out_ptr + pid_k * stride_os + rows[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (cols[None, :] < N))


@triton.jit
def _sum_splits_kernel(
    part_ptr, bias_ptr, out_ptr, N, stride_pm, stride_ps, stride_om,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):  # a fixed order: the same sum every run
        total += tl.load(part_ptr + s * stride_ps + row * stride_pm + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + cols, total.to(out_ptr.dtype.element_ty), mask=mask)


def skinny_gemm(
    x: torch.Tensor,  # [M, K], M <= MAX_ROWS
    weight: torch.Tensor,  # [N, K], contiguous
    bias: torch.Tensor | None,  # [N]
    config: SkinnyConfig,
    norm: tuple[torch.Tensor | None, torch.Tensor, float, bool] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([M, N] = x' @ weight.T + bias, the residual sum [M, K])
    """``x @ weight.T + bias`` in x's dtype. With ``norm = (residual, norm_weight, eps, unit_offset)``
    x' is first RMSNorm(x + residual) as `fused_ops.add_rms_norm` computes it (residual None: of x),
    and the second result is ``x + residual`` (x itself without a residual or a norm)."""
    m, k = x.shape
    n = weight.shape[0]
    if m > MAX_ROWS or x.dtype not in SKINNY_DTYPES or weight.dtype != x.dtype:
        raise ValueError(
            f"skinny_gemm takes at most {MAX_ROWS} rows of bfloat16 or float16 and a weight of their dtype; "
            f"got {m} rows of {x.dtype} and a {weight.dtype} weight"
        )
    x = x.contiguous()
    residual, norm_weight, eps, unit_offset = norm if norm is not None else (None, None, 0.0, False)
    has_residual = residual is not None
    total = torch.empty_like(x) if has_residual else x
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        if has_residual and m:
            total.copy_(x + residual)
        return out, total
    split = config.split_k
    # each split's K is a whole number of tiles, so no tile straddles two splits
    k_per_split = triton.cdiv(triton.cdiv(k, split), config.block_k) * config.block_k
    direct = split == 1 and bias is None
    part = out if direct else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, config.block_n), split)
    _skinny_gemm_kernel[grid](
        x, residual.contiguous() if has_residual else x, norm_weight if norm is not None else x, total,
        weight, part, m, n, k, eps, 1.0 if unit_offset else 0.0,
        x.stride(0), weight.stride(0), part.stride(-2), 0 if direct else part.stride(0), k_per_split,
        BLOCK_M=MAX_ROWS, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        NUM_STAGES=config.num_stages, NORM=norm is not None, HAS_RESIDUAL=has_residual,
        UPCAST=INTERPRETED, num_warps=config.num_warps,
    )  # fmt: skip
    if not direct:
        block = 1024
        _sum_splits_kernel[(m, triton.cdiv(n, block))](
            part, bias if bias is not None else part, out, n, part.stride(1), part.stride(0), out.stride(0),
            SPLIT_K=split, HAS_BIAS=bias is not None, BLOCK=block,
        )  # fmt: skip
    return out, total
