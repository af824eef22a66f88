"""The own decoder's projections over a few rows on CUDA: the skinny-GEMM Triton kernel
(`triton_kernels/skinny_gemm.py`) where it measured faster than cuBLAS, with the RMSNorm before a
projection fused into it.

A decode or verify step multiplies 1 to 16 rows by each weight. `SkinnyLinear` stands in for an
``nn.Linear`` of the own decoder (the same weight and bias, no copy) and picks its kernel by the call's
rows: cuBLAS (``F.linear``), or the Triton kernel at the config the kernel plan measured for that many
rows (`kernel_plan/skinny_gemm.py`). The q/k/v and gate/up projections follow a norm: there the Triton
kernel also does the residual add and the norm (`project_normed`), one launch where the unfused layer
takes two.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger("specexec")

ROW_BUCKETS = (1, 4, 8, 16)  #: rows the plan measures; each stands for the row counts up to it

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class SkinnyLinear(nn.Module):
    """An ``nn.Linear`` whose calls of few rows may run the skinny-GEMM kernel (see the module doc)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = linear.weight  # [out, in] (shared with the module it replaces)
        self.bias = linear.bias  # [out] or None
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.configs: dict[int, object] = {}  #: row bucket -> SkinnyConfig (absent: cuBLAS)

    def config_for(self, rows: int):
        """The measured config for a call of ``rows`` rows, or None (cuBLAS)."""
        for bucket in ROW_BUCKETS:
            if rows <= bucket:
                return self.configs.get(bucket)
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        config = self.config_for(x.shape[0]) if x.dim() == 2 else None
        if config is None:
            return F.linear(x, self.weight, self.bias)
        from .triton_kernels.skinny_gemm import skinny_gemm

        return skinny_gemm(x, self.weight, self.bias, config)[0]

    def normed(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, norm
    ) -> tuple[torch.Tensor, torch.Tensor]:  # [T, in] each -> ([T, out], [T, in])
        """``(self(norm(hidden + residual)), hidden + residual)``, fused where a config was measured."""
        config = self.config_for(hidden.shape[0])
        if config is None:
            h, total = norm.add_forward(hidden, residual)
            return F.linear(h, self.weight, self.bias), total
        from .triton_kernels.skinny_gemm import skinny_gemm

        return skinny_gemm(
            hidden, self.weight, self.bias, config, (residual, norm.weight, norm.eps, norm.unit_offset)
        )

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, configs={self.configs}"


def project_normed(norm, proj: nn.Module, hidden: torch.Tensor, residual: torch.Tensor | None):
    """``(proj(norm(hidden + residual)), hidden + residual)``: one kernel where ``proj`` can fuse it."""
    if isinstance(proj, SkinnyLinear):
        return proj.normed(hidden, residual, norm)
    h, total = norm.add_forward(hidden, residual)
    return proj(h), total


def wrap_projections(model: nn.Module) -> list[tuple[str, SkinnyLinear, object]]:
    """Replace the own decoder's dense projections by `SkinnyLinear` (once; later calls find them):
    (name, layer, the norm before it or None) for each."""
    found = []
    for layer in model.model.layers:
        for name in PROJECTIONS:
            module = getattr(layer, name, None)
            if type(module) is nn.Linear:
                module = SkinnyLinear(module)
                setattr(layer, name, module)
            if isinstance(module, SkinnyLinear):
                found.append((name, module, _norm_before(layer, name)))
    return found


def _norm_before(layer: nn.Module, name: str):
    if name == "qkv_proj":
        return layer.input_layernorm
    if name == "gate_up_proj":
        return getattr(layer, "pre_feedforward_layernorm", None) or layer.post_attention_layernorm
    return None
