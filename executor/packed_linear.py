"""Dense linear layers run by oneDNN on weights reordered once into its blocked layout.

``F.linear`` on a CPU calls the BLAS (MKL in torch's CPU wheels). On the AMD EPYC (AVX2) this project
measured, MKL's matrix-vector path streams SmolLM2-135M's linear weights in 64 ms per decode step, but
its matrix-matrix path takes 114 ms for 4 rows: verifying 3 drafts cost 1.8x one token. oneDNN on
weights packed ahead of time took 46 ms for 1 row and 54 ms for 4 (1.17x), the same weights and the
same float32 arithmetic (sums in another order: results agree to float32 rounding, not bit for bit).

- ``torch.ops.mkldnn._reorder_linear_weight(weight [out, in])`` packs a weight (an opaque mkldnn
  tensor; any number of rows may use it), ``torch.ops.mkldnn._linear_pointwise(x, packed, bias, ...)``
  multiplies. These are the ops torch's own compiler emits for CPU linears (Inductor's freezing pass).
- float32 everywhere oneDNN runs; bfloat16 only where the CPU has the instructions (AVX512-BF16 or
  AVX-NE-CONVERT): `can_pack` asks the kernel once per dtype. float64 and float16 stay with the BLAS.

Whether a model's layers are packed is decided by `linear_backend.choose_linear_backend` (measured per
CPU); this module only packs.
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def can_pack(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs and multiplies ``dtype`` weights on this CPU (a tiny self-test, once)."""
    if dtype not in PACKABLE_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    try:
        weight = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(dtype) / 8  # [out 3, in 4]
        x = torch.ones(2, 4, dtype=dtype)  # [rows 2, in 4]
        out = torch.ops.mkldnn._linear_pointwise(x, _pack(weight), None, "none", [], "")
        return torch.equal(out.float(), F.linear(x, weight).float())
    except (RuntimeError, AttributeError):  # an op missing, or the CPU lacks the dtype's instructions
        return False


def _pack(weight: torch.Tensor) -> torch.Tensor:  # [out, in] dense -> opaque mkldnn tensor
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())


class PackedLinear(nn.Module):
    """An ``nn.Linear`` whose weight lives only in oneDNN's layout (the dense copy is dropped unless
    another module shares it, as a tied LM head shares the token embedding)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if linear.weight.device.type != "cpu" or not can_pack(linear.weight.dtype):
            raise ValueError(
                f"oneDNN cannot pack a {linear.weight.dtype} weight on {linear.weight.device} on this CPU"
            )
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype = linear.weight.dtype
        self.packed = _pack(linear.weight)  # opaque: not a parameter, not in the state dict
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def to_linear(self) -> nn.Linear:
        """A dense ``nn.Linear`` with the same weight (exactly: packing only reorders)."""
        dense = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        dense.weight = nn.Parameter(self.packed.to_dense(), requires_grad=False)
        dense.bias = self.bias
        return dense

    def __deepcopy__(self, memo) -> PackedLinear:  # an opaque tensor has no storage to copy
        dense = self.to_linear()
        dense.bias = copy.deepcopy(self.bias, memo)
        return PackedLinear(dense)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.dtype}, onednn"


def pack_linears(model: nn.Module) -> int:
    """Replace every dense CPU ``nn.Linear`` of a packable dtype in ``model`` by a `PackedLinear`, in
    place; returns how many were replaced (quantized layers and other dtypes are left as they are)."""
    found = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and child.weight.device.type == "cpu" and can_pack(child.weight.dtype)
    ]
    for parent, name, child in found:
        setattr(parent, name, PackedLinear(child))
    return len(found)


def unpack_linears(model: nn.Module) -> nn.Module:
    """The inverse of `pack_linears`, in place (before copying or quantizing a model again)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear):
                setattr(parent, name, child.to_linear())
    return model
