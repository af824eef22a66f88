"""specexec's Triton kernels for the own decoder on CUDA: the GPU side of `cpu_kernels.py`'s C++ ops.

- `fused_ops.py`: the residual add with its RMSNorm, RoPE with the K/V cache write, act(gate) * up: one
  kernel each where torch launches two to six;
- `paged_attention.py`: decode and verify rows attending straight over the paged KV pool (split over
  chunks of keys, then merged): no gather of the pages into a padded copy, no mask.

They take float32, bfloat16 and float16 tensors on a CUDA device (float64, the tests' reference dtype,
stays on torch ops) and capture into CUDA graphs like any other launch. Where Triton cannot be imported,
or with ``SPECEXEC_CUDA_KERNELS=0``, every caller runs its torch ops instead and the log says so once.
Under ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors (how the CPU suite checks them).
"""

from __future__ import annotations

import functools
import logging
import os

import torch

logger = logging.getLogger("specexec")

SWITCH = "SPECEXEC_CUDA_KERNELS"  #: "0" keeps every CUDA op of the own decoder on torch
#: the dtypes the kernels take
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def triton_available() -> bool:
    """Whether the kernels can run: Triton imports and the switch is not off (logged once)."""
    if os.environ.get(SWITCH) == "0":
        logger.info("Triton kernels off (%s=0): the own decoder runs torch ops on CUDA", SWITCH)
        return False
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        logger.info("Triton not importable (%s): the own decoder runs torch ops on CUDA", exc)
        return False
    return True


def triton_ops_take(x: torch.Tensor) -> bool:
    """Whether the Triton kernels run for this tensor: on a CUDA device, in a dtype they take."""
    return x.device.type == "cuda" and x.dtype in TRITON_DTYPES and triton_available()


def triton_ops():
    """The fused ops (`fused_ops.py`); import only after `triton_ops_take` said yes."""
    from . import fused_ops

    return fused_ops
