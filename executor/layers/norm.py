"""RMSNorm as the Llama family computes it, in one torch op where that gives the same numbers.

Two conventions (transformers' own modules differ, and so must we to give their tokens):
- Llama, Mistral, Qwen2/3: ``weight * normalize(x in float32).to(x.dtype)``;
- Gemma2/3: ``(normalize(x in float32) * (1 + weight in float32)).to(x.dtype)`` (the weight is stored
  as an offset from 1).

On the CPU in float32, bfloat16 and float16 the C++ op ``add_rms_norm`` (`fused_ops_cpu.cpp`) does
the residual add and the norm in one pass, on CUDA the Triton kernel of the same name
(`triton_kernels/fused_ops.py`); elsewhere ``torch.rms_norm`` (float32 inside, float32's
numbers bit for bit). A float64 model (the tests' reference dtype) normalizes in float32 like
transformers does, so its outputs match transformers' to float64 precision.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .fused_ops import fused_ops_for


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension; ``unit_offset``: Gemma's ``1 + weight`` convention."""

    def __init__(self, weight: torch.Tensor, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach(), requires_grad=False)  # [dim]
        self.eps = eps
        self.unit_offset = unit_offset

    @classmethod
    def from_module(cls, module: nn.Module) -> RMSNorm:
        """The same norm as a transformers RMSNorm module (Llama's or Gemma's convention, by its class)."""
        eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps", None)
        if eps is None:
            raise ValueError(f"{type(module).__name__}: no epsilon found (variance_epsilon or eps)")
        return cls(module.weight, float(eps), unit_offset="Gemma" in type(module).__name__)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        ops = fused_ops_for(x)
        if ops is not None:
            out, _ = ops.add_rms_norm(
                x.reshape(-1, x.shape[-1]), None, self.weight, self.eps, self.unit_offset
            )
            return out.view(x.shape)
        return self._torch_forward(x)

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:  # [T, dim] each: (norm(residual + x), residual + x)
        """The residual add then the norm (``residual=None``: no add), in one op where it can."""
        ops = fused_ops_for(x)
        if ops is not None:
            return ops.add_rms_norm(x, residual, self.weight, self.eps, self.unit_offset)
        total = x if residual is None else residual + x
        return self._torch_forward(total), total

    def _torch_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.unit_offset:
            weight = 1.0 + self.weight.float()
            return F.rms_norm(x.float(), (x.shape[-1],), weight, self.eps).to(x.dtype)
        if x.dtype == torch.float64:
            return self.weight * F.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(x.dtype)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, unit_offset={self.unit_offset}"
