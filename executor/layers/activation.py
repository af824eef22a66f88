"""act(gate) * up over a fused gate/up projection's output: one C++ op on the CPU (``act_mul``,
`fused_ops_cpu.cpp`) and one Triton kernel on CUDA (`triton_kernels/fused_ops.py`) for the activations
they know, torch's two ops otherwise."""

from __future__ import annotations

import torch
from torch import nn

from .fused_ops import fused_ops_for

#: the fused op's code for each activation module it computes (transformers' classes, by name)
FUSED_ACTIVATIONS = {"SiLUActivation": 0, "SiLU": 0, "GELUTanh": 1, "PytorchGELUTanh": 1}


def fused_activation_code(act: nn.Module) -> int | None:
    """The C++ op's code for ``act`` (None: not one it computes)."""
    return FUSED_ACTIVATIONS.get(type(act).__name__)


def act_mul(gate_up: torch.Tensor, act: nn.Module, code: int | None) -> torch.Tensor:
    """[T, 2 * intermediate] -> act(gate) * up [T, intermediate]."""
    ops = fused_ops_for(gate_up) if code is not None else None
    if ops is not None:
        return ops.act_mul(gate_up, code)
    gate, up = gate_up.chunk(2, dim=-1)
    return act(gate) * up
