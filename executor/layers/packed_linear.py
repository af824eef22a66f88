"""Dense linear layers on weights packed once: oneDNN's blocked layout, MKL's packed GEMM, or both beside
the dense weight, the kernel picked per call by its rows.

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

Neither is fastest at every number of rows. On a 2-core Intel Xeon (AVX-512, 2026-11-26) MKL streams
SmolLM2's linear weights in 21-24 ms for 1 to 3 rows but takes 35-41 ms for 4 (its matrix-matrix path),
where oneDNN takes 26 and 29: verifying 3 drafts cost about 1.7x a decode step's linear time on the BLAS,
1.4x with the decode step on the BLAS and the verify on oneDNN. A `PackedLinear` given `RowBands` keeps the
dense weight beside the packed one and picks per call by the number of rows; it then holds both copies.

MKL's own packed GEMM does better still for one fixed number of rows (on that Xeon 26 ms for 4 rows,
against oneDNN's 29 and the BLAS's 35, so a verify of 3 drafts costs about what 3 rows cost):
``torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)`` packs for exactly ``rows`` (another copy of
the weight), ``torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)`` multiplies. A `PackedLinear`
given ``mkl_rows`` runs calls of exactly that many rows on it (float32 only).

Whether a model's layers are packed, and for which rows, is decided by
`linear_backend.choose_linear_backend` (measured per CPU); this module only packs.
"""

from __future__ import annotations

import bisect
import copy
import functools
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class RowBands:
    """Which kernel multiplies a call of a given number of rows (tokens): rows from ``starts[i]`` up to
    the next start run on oneDNN where ``is_onednn[i]``, on the BLAS otherwise."""

    starts: tuple[int, ...]  #: ascending, the first is 1
    is_onednn: tuple[bool, ...]  #: one per start

    def __post_init__(self) -> None:
        if not self.starts or self.starts[0] != 1 or list(self.starts) != sorted(set(self.starts)):
            raise ValueError(f"row bands must start at 1 and ascend: {self.starts}")
        if len(self.is_onednn) != len(self.starts):
            raise ValueError("row bands need one kernel per start")

    def uses_onednn(self, num_rows: int) -> bool:
        return self.is_onednn[max(0, bisect.bisect_right(self.starts, num_rows) - 1)]

    def describe(self) -> str:
        """E.g. "oneDNN for 4-23 rows, the BLAS for 1-3, 24+"."""
        ends = [start - 1 for start in self.starts[1:]] + [None]
        spans = {True: [], False: []}
        for start, end, onednn in zip(self.starts, ends, self.is_onednn):
            spans[onednn].append(
                f"{start}+" if end is None else f"{start}" if end == start else f"{start}-{end}"
            )
        return f"oneDNN for {', '.join(spans[True])} rows, the BLAS for {', '.join(spans[False])}"


def _pack(weight: torch.Tensor) -> torch.Tensor:  # [out, in] dense -> opaque mkldnn tensor
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())


@functools.cache
def can_pack_mkl(dtype: torch.dtype) -> bool:
    """Whether MKL's packed GEMM runs ``dtype`` here (float32 in torch builds with MKL; a self-test)."""
    if dtype != torch.float32 or not torch.backends.mkl.is_available():
        return False
    try:
        weight = torch.arange(12, dtype=dtype).reshape(3, 4) / 8  # [out 3, in 4]
        x = torch.ones(2, 4, dtype=dtype)  # [rows 2, in 4]
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, 2)
        return torch.equal(torch.ops.mkl._mkl_linear(x, packed, weight, None, 2), F.linear(x, weight))
    except (RuntimeError, AttributeError):  # a build without MKL's ops
        return False


class PackedLinear(nn.Module):
    """An ``nn.Linear`` whose weight is packed ahead of time. Without ``bands`` every call runs on oneDNN
    and the dense copy is dropped (unless another module shares it, as a tied LM head shares the token
    embedding); with them the dense weight stays too, for the rows the BLAS runs (no oneDNN copy when no
    band uses it). ``mkl_rows``: calls of exactly that many rows run on MKL's packed GEMM (the dense
    weight kept as well)."""

    def __init__(self, linear: nn.Linear, bands: RowBands | None = None, mkl_rows: int | None = None) -> None:
        super().__init__()
        weight = linear.weight.detach()  # [out, in]
        uses_onednn = bands is None or any(bands.is_onednn)
        if weight.device.type != "cpu" or (uses_onednn and not can_pack(weight.dtype)):
            raise ValueError(f"oneDNN cannot pack a {weight.dtype} weight on {weight.device} on this CPU")
        if mkl_rows is not None and not can_pack_mkl(weight.dtype):
            raise ValueError(f"MKL's packed GEMM cannot run a {weight.dtype} weight in this torch build")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype = weight.dtype
        self.bands, self.mkl_rows = bands, mkl_rows
        self.packed = _pack(weight) if uses_onednn else None  # opaque: not a parameter, not in the state dict
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        #: the same tensor as the layer's (not copied), kept for the BLAS's rows and MKL's packed GEMM
        self.dense_weight = None if bands is None and mkl_rows is None else weight
        self.mkl_packed = (
            None if mkl_rows is None else torch.ops.mkl._mkl_reorder_linear_weight(weight, mkl_rows)
        )

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        num_rows = x.numel() // max(1, self.in_features)
        if num_rows == self.mkl_rows:
            flat = x.reshape(num_rows, self.in_features).contiguous()  # [rows, in]
            out = torch.ops.mkl._mkl_linear(flat, self.mkl_packed, self.dense_weight, self.bias, num_rows)
            return out.view(*x.shape[:-1], self.out_features)
        if self.bands is not None and not self.bands.uses_onednn(num_rows):
            return F.linear(x, self.dense_weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def to_linear(self) -> nn.Linear:
        """A dense ``nn.Linear`` with the same weight (exactly: packing only reorders); the kept dense
        tensor itself where there is one, so a tied weight stays tied."""
        dense = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        weight = self.packed.to_dense() if self.dense_weight is None else self.dense_weight
        dense.weight = nn.Parameter(weight, requires_grad=False)
        dense.bias = self.bias
        return dense

    def __deepcopy__(self, memo) -> PackedLinear:  # an opaque tensor has no storage to copy
        dense = self.to_linear()
        if self.dense_weight is not None:  # the kept tensor is this layer's own: the copy gets its own
            dense.weight = nn.Parameter(copy.deepcopy(self.dense_weight, memo), requires_grad=False)
        dense.bias = copy.deepcopy(self.bias, memo)
        return PackedLinear(dense, self.bands, self.mkl_rows)

    def describe_kernels(self) -> str:
        kernels = "oneDNN" if self.bands is None else self.bands.describe()
        return kernels if self.mkl_rows is None else f"{kernels}; MKL packed for {self.mkl_rows} rows"

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.dtype}, "
            f"{self.describe_kernels()}"
        )


def _packable_linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, name, layer) of every dense CPU ``nn.Linear`` of a packable dtype in ``model``."""
    return [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and child.weight.device.type == "cpu" and can_pack(child.weight.dtype)
    ]


def packable_linear_bytes(model: nn.Module) -> int:
    """The bytes of the weights `pack_linears` would pack (what each more copy of them costs)."""
    return sum(layer.weight.numel() * layer.weight.element_size() for _, _, layer in _packable_linears(model))


def pack_linears(model: nn.Module, bands: RowBands | None = None, mkl_rows: int | None = None) -> int:
    """Replace every dense CPU ``nn.Linear`` of a packable dtype in ``model`` by a `PackedLinear` (on
    ``bands``, with ``mkl_rows``), in place; returns how many were replaced (quantized layers and other
    dtypes are left as they are)."""
    found = _packable_linears(model)
    for parent, name, child in found:
        setattr(parent, name, PackedLinear(child, bands, mkl_rows))
    return len(found)


def unpack_linears(model: nn.Module) -> nn.Module:
    """The inverse of `pack_linears`, in place (before copying or quantizing a model again)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear):
                setattr(parent, name, child.to_linear())
    return model
