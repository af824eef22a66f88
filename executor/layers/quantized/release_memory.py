"""Giving back what a model's quantization freed, so the resident set after loading is the quantized
model's and not the dense one's it was made from.

- A checkpoint loaded in its own dtype (float32 for a GGUF's converted copy) leaves every weight a view
  of the memory-mapped safetensors file: while one of them lives (a norm, a bias, an embedding), the
  whole mapping stays, and every page the load touched counts as resident (1.5 GB for a 0.5B model's
  float32 copy). `own_mapped_tensors` copies what is left of them into the process's own memory.
- glibc keeps freed heap pages for reuse; after the dense weights go, `trim_freed_heap` returns them
  (400 MB on the same load).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import torch
from torch import nn


def own_mapped_tensors(model: nn.Module) -> int:
    """Copy every parameter and buffer of ``model`` whose storage it does not own (a memory-mapped file's
    or another buffer's: not resizable) into memory of its own, keeping tied tensors tied. Returns the
    bytes copied."""
    copies: dict[tuple, torch.Tensor] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is None or tensor.device.type != "cpu" or tensor.untyped_storage().resizable():
                    continue
                key = (tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
                if key not in copies:
                    copy = tensor.detach().clone()
                    if isinstance(tensor, nn.Parameter):
                        copy = nn.Parameter(copy, requires_grad=tensor.requires_grad)
                    copies[key] = copy
                table[name] = copies[key]
    return sum(t.numel() * t.element_size() for t in copies.values())


def trim_freed_heap() -> bool:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim``); False where there is none."""
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
