"""Backend choice for the grammar mask: the CuPy kernel on CUDA when CuPy is installed, else torch."""

from __future__ import annotations

import functools

import torch

from .apply_mask_cupy import KERNEL_NAMES, apply_mask_inplace_cupy
from .apply_mask_torch import apply_mask_inplace_torch, check_mask_args

__all__ = ["BACKENDS", "apply_mask_inplace", "cupy_available"]

BACKENDS = ("auto", "torch", "cupy")


@functools.cache
def cupy_available() -> bool:
    """Whether CuPy imports (checked once per process; CuPy is the optional ``cuda`` extra)."""
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


def apply_mask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    needs_mask: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    backend: str = "auto",
    *,
    mask_vocab: int | None = None,
) -> None:
    """Set the logits of grammar-disallowed tokens to -inf, in place.

    Args:
        logits: ``[num_rows, vocab]`` float32/float16/bfloat16 (float64 on the torch path); rows may
            be strided.
        bitmask: ``[num_rows, ceil(mask_vocab / 32)]`` int32, xgrammar packing (bit ``t % 32``
            of word ``t // 32`` set = token ``t`` allowed).
        needs_mask: optional ``[num_rows]`` int32 (or bool); rows with 0 are left untouched.
        d2t: optional ``[vocab]`` int64/int32 draft-to-target offsets (EAGLE-3): draft column
            ``i`` is allowed iff target token ``i + d2t[i]`` is.
        backend: ``"auto"`` (CuPy kernel for CUDA tensors when CuPy imports, else torch),
            ``"torch"`` or ``"cupy"`` (CUDA tensors only).
        mask_vocab: tokens covered by the bitmask (default ``32 * words``); logits columns at
            or past it (padding vocab) become -inf.

    Raises:
        ValueError: bad shapes, dtypes or devices, an unknown backend, or ``"cupy"`` for
            tensors that are not on a CUDA device.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    check_mask_args(logits, bitmask, needs_mask, d2t, mask_vocab)
    on_cuda = logits.device.type == "cuda"
    if backend == "cupy" and not on_cuda:
        raise ValueError(
            f"backend='cupy' runs a CUDA kernel and needs CUDA tensors, but logits are on {logits.device}; "
            "use backend='torch' or 'auto'"
        )
    if backend == "cupy" and logits.dtype not in KERNEL_NAMES:
        raise ValueError(f"the CUDA kernel takes float32, float16 or bfloat16 logits, got {logits.dtype}")
    kernel_dtype = logits.dtype in KERNEL_NAMES
    if backend == "cupy" or (backend == "auto" and on_cuda and kernel_dtype and cupy_available()):
        apply_mask_inplace_cupy(logits, bitmask, needs_mask, d2t, mask_vocab=mask_vocab)
    else:
        apply_mask_inplace_torch(logits, bitmask, needs_mask, d2t, mask_vocab=mask_vocab)
