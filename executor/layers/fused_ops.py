"""The own decoder's fused ops for a tensor's device: the C++ CPU ops (`cpu_kernels.py`) on the CPU, the
Triton kernels (`triton_kernels/fused_ops.py`) on CUDA. Both sets take the same arguments and round as
the torch ops they replace:

- ``add_rms_norm(x, residual, weight, eps, unit_offset) -> (norm(residual + x), residual + x)``;
- ``rotary_kv_write(qkv, rows, kv, slots, num_heads, num_kv_heads, head_dim) -> q``: RoPE on a fused QKV
  output's q and k heads, the rotated keys and the values written into the pool at their slots;
- ``act_mul(gate_up, code) -> act(gate) * up``.
"""

from __future__ import annotations

import torch

from .cpu_kernels import cpu_kernels, fused_ops_take
from .triton_kernels import triton_ops, triton_ops_take


def fused_ops_for(x: torch.Tensor):
    """The fused ops that run for ``x`` (its device and dtype), or None where torch ops run."""
    if fused_ops_take(x):
        return cpu_kernels()
    if triton_ops_take(x):
        return triton_ops()
    return None
