"""CUDA path of the grammar mask: `apply_mask.cu` compiled by NVRTC through CuPy.

Takes torch CUDA tensors, hands them to CuPy with ``cupy.from_dlpack`` (zero copy) and launches
on torch's current stream, so the kernel is ordered with the surrounding torch work and the
caching allocator may reuse the temporaries it frees here. CuPy is imported inside the
functions: this module imports without it (CuPy is the optional ``cuda`` extra).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .apply_mask_torch import check_mask_args

__all__ = ["apply_mask_inplace_cupy"]

# The CUDA source sits next to this module (shared by the CuPy path and the nvcc test).
SOURCE_PATH = Path(__file__).with_name("apply_mask.cu")

#: Logits dtype -> name expression of the kernel instantiation.
KERNEL_NAMES: dict[torch.dtype, str] = {
    torch.float32: "apply_mask_kernel<float>",
    torch.float16: "apply_mask_kernel<__half>",
    torch.bfloat16: "apply_mask_kernel<__nv_bfloat16>",
}
_NVRTC_OPTIONS = ("--std=c++17",)
_THREADS = 256  # matches __launch_bounds__(256) in apply_mask.cu
_COLUMNS_PER_THREAD = 4  # grid.x is sized for this; the kernel's loop is correct for any grid
_MAX_GRID_Y = 65535  # one grid row per logits row

_modules: dict[int, Any] = {}  # device index -> cupy.RawModule
_kernels: dict[tuple[int, torch.dtype], Any] = {}  # (device index, dtype) -> cupy.RawKernel
_lock = threading.Lock()


def _kernel(device_index: int, dtype: torch.dtype) -> Any:
    """The compiled kernel for `dtype` on `device_index` (compiled once per device).

    Must be called with that device current: CuPy compiles for the current device.
    """
    key = (device_index, dtype)
    kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    import cupy

    with _lock:
        module = _modules.get(device_index)
        if module is None:
            module = cupy.RawModule(
                code=SOURCE_PATH.read_text(),
                options=_NVRTC_OPTIONS,
                name_expressions=list(KERNEL_NAMES.values()),
            )
            _modules[device_index] = module
        kernel = module.get_function(KERNEL_NAMES[dtype])
        _kernels[key] = kernel
    return kernel


def _torch_stream_for_cupy(cupy: Any, device: torch.device, device_index: int) -> Any:
    """torch's current stream on `device` as a CuPy stream (usable as a context manager).

    CuPy >= 14 deprecates ``ExternalStream`` (a DeprecationWarning, an error under this
    project's pytest settings) in favour of ``Stream.from_external``, which takes torch's
    stream through the CUDA stream protocol; CuPy 13 only has ``ExternalStream``.
    """
    torch_stream = torch.cuda.current_stream(device)
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None and hasattr(torch_stream, "__cuda_stream__"):
        return from_external(torch_stream)
    return cupy.cuda.ExternalStream(torch_stream.cuda_stream, device_index)


def apply_mask_inplace_cupy(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    needs_mask: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    *,
    mask_vocab: int | None = None,
) -> None:
    """Set disallowed logits to -inf in place with the CUDA kernel (same semantics as the torch path).

    All tensors must be on the same CUDA device; logits rows may be strided but each row's
    columns must be contiguous. Asynchronous: returns once the kernel is queued on torch's
    current stream.
    """
    mask_vocab = check_mask_args(logits, bitmask, needs_mask, d2t, mask_vocab)
    if logits.device.type != "cuda":
        raise ValueError(f"the cupy backend needs CUDA tensors, logits are on {logits.device}")
    num_rows, vocab = logits.shape
    if num_rows == 0 or vocab == 0:
        return
    if vocab > 1 and logits.stride(1) != 1:
        raise ValueError(
            f"the cupy backend needs contiguous columns (logits.stride(1) == 1), got strides {logits.stride()}"
        )
    if num_rows > _MAX_GRID_Y:
        raise ValueError(f"the cupy backend handles at most {_MAX_GRID_Y} rows per call, got {num_rows}")

    import cupy

    # Same-layout conversions, queued on torch's current stream like the kernel.
    bitmask = bitmask.contiguous()
    needs = None if needs_mask is None else needs_mask.to(torch.int32).contiguous()
    d2t64 = None if d2t is None else d2t.to(torch.int64).contiguous()
    # CuPy has no bfloat16 dtype: hand over the bits; the kernel only needs the pointer.
    logits_view = logits.view(torch.int16) if logits.dtype == torch.bfloat16 else logits

    device_index = logits.device.index if logits.device.index is not None else torch.cuda.current_device()
    grid = (-(-vocab // (_THREADS * _COLUMNS_PER_THREAD)), num_rows)
    null = np.uint64(0)  # nullptr for the optional pointer arguments
    with cupy.cuda.Device(device_index), _torch_stream_for_cupy(cupy, logits.device, device_index):
        kernel = _kernel(device_index, logits.dtype)
        # from_dlpack inside the stream context: producer and consumer streams are the same,
        # so torch inserts no extra synchronisation.
        args = (
            cupy.from_dlpack(logits_view),
            np.int64(logits.stride(0)),
            cupy.from_dlpack(bitmask),
            np.int32(bitmask.shape[1]),
            null if needs is None else cupy.from_dlpack(needs),
            null if d2t64 is None else cupy.from_dlpack(d2t64),
            np.int32(vocab),
            np.int32(mask_vocab),
            np.int32(num_rows),
        )
        kernel(grid, (_THREADS,), args)
