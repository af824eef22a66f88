"""Weight-only int8 quantization of a model's linear layers (for the self-speculative draft).

Per-output-channel symmetric int8 weights; on CPU the matmul is torch's ``_weight_int8pack_mm``
kernel with bfloat16 activations, which reads a quarter of the float32 bytes.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

#: activation dtypes served by the int8 kernel (run in bfloat16, its fast path on CPU); float64 (tests)
#: dequantizes on the fly
KERNEL_DTYPES = (torch.float32, torch.bfloat16)


class Int8WeightOnlyLinear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()  # [out, in]
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out]
        self.register_buffer(
            "weight_int8", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        )
        self.register_buffer("scale", scale.to(weight.dtype))  # [out]
        self.register_buffer("scale_bf16", scale.to(torch.bfloat16))  # [out]
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        flat = x.reshape(-1, self.in_features)
        if x.dtype in KERNEL_DTYPES and x.device.type == "cpu":
            out = torch._weight_int8pack_mm(flat.to(torch.bfloat16), self.weight_int8, self.scale_bf16).to(
                x.dtype
            )
        else:
            out = F.linear(flat, self.weight_int8.to(x.dtype) * self.scale.to(x.dtype)[:, None])
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def quantized_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose ``nn.Linear`` layers (lm_head included) hold int8 weights."""
    draft = copy.deepcopy(model)
    for parent in list(draft.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8WeightOnlyLinear(child))
    return draft.eval()
