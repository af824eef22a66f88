"""One rank's slice of a linear layer, in the form the layer has: whole output rows (a column-parallel
layer, the vocabulary-parallel head) or a range of input columns (a row-parallel layer).

Every form a layer takes here slices its codes as stored, so no value changes:
- dense ``nn.Linear``: the weight (and bias) rows or columns;
- int8 per output row (`Int8WeightOnlyLinear`): the codes, and the scales of the rows kept;
- int4 in groups (`Int4WeightOnlyLinear`, a GGUF's Q4_0 / Q4_1 / Q4_K): the codes, and the scales and
  offsets of the rows and groups kept;
- a GGUF's Q8_0, Q5_0, Q6_K, Q5_1 and Q5_K blocks (`Int8BlockLinear`): the codes, and the scales and
  offsets of the blocks kept.

A slice the layer's kernel cannot hold (int4: output rows in multiples of 16, columns cut at group
boundaries; Q8_0 blocks: rows in multiples of 8, columns cut at blocks of 32) is held dense, as its
dequantized weights in the model's dtype; `is_held_dense` tells the caller. A slice keeps the layer's
``int8_dot`` routing (`quantized_kernel`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..layers.quantized.q8_block_linear import Int8BlockLinear
from ..layers.quantized.quantized_dot import BLOCK, TILE
from ..layers.quantized.quantized_linear import (
    INT4_ROWS_MULTIPLE,
    Int4WeightOnlyLinear,
    Int4Weights,
    Int8WeightOnlyLinear,
    linear_shape,
)

SLICEABLE = (nn.Linear, Int8WeightOnlyLinear, Int4WeightOnlyLinear, Int8BlockLinear)


@dataclass(frozen=True, slots=True)
class Cut:
    """Which output rows (``rows``: ranges, then zero rows up to ``pad_to``; None: all) and which input
    columns (``columns``: ``[start, stop)``; None: all) a slice keeps."""

    rows: tuple[tuple[int, int], ...] | None = None
    pad_to: int | None = None
    columns: tuple[int, int] | None = None

    def of_rows(self, tensor: torch.Tensor) -> torch.Tensor:  # [out, ...] -> [kept rows, ...]
        if self.rows is None:
            return tensor
        picked = torch.cat([tensor[start:stop] for start, stop in self.rows])
        if self.pad_to is not None and self.pad_to > picked.shape[0]:  # zero weights, outputs cut off
            picked = torch.cat([picked, picked.new_zeros(self.pad_to - picked.shape[0], *picked.shape[1:])])
        return picked.contiguous()

    def of(self, tensor: torch.Tensor, unit: int = 1) -> torch.Tensor:
        """tensor [out, in / unit] (``unit`` input columns per column: a scale per group) -> the slice."""
        tensor = self.of_rows(tensor)
        if self.columns is None:
            return tensor
        start, stop = self.columns
        return tensor[:, start // unit : stop // unit].contiguous()

    def holds(self, unit: int, out_features: int, rows_multiple: int) -> bool:
        """Whether a kernel with blocks of ``unit`` inputs and tiles of ``rows_multiple`` rows holds it."""
        cut = self.columns or (0, 0)
        return cut[0] % unit == 0 and cut[1] % unit == 0 and out_features % rows_multiple == 0


def take_rows(layer: nn.Module, ranges: list[tuple[int, int]], pad_to: int | None = None) -> nn.Module:
    """The output rows in ``ranges``, one after another, then zero rows up to ``pad_to``."""
    _check_sliceable(layer)
    cut = Cut(rows=tuple(ranges), pad_to=pad_to)
    out_features = max(pad_to or 0, sum(stop - start for start, stop in ranges))
    bias = None if layer.bias is None else cut.of_rows(layer.bias.detach())
    return _rebuilt(layer, cut, out_features, layer.in_features, bias)


def take_columns(layer: nn.Module, start: int, stop: int, keep_bias: bool) -> nn.Module:
    """Input columns ``[start, stop)``; the bias only where ``keep_bias`` (one rank adds it after the
    all-reduce's sum)."""
    _check_sliceable(layer)
    bias = layer.bias.detach().clone() if keep_bias and layer.bias is not None else None
    return _rebuilt(layer, Cut(columns=(start, stop)), layer.out_features, stop - start, bias)


def is_held_dense(original: nn.Module, sliced: nn.Module) -> bool:
    """Whether a quantized layer's slice had to be held dense (see the module doc)."""
    return type(original) is not nn.Linear and type(sliced) is nn.Linear


def _rebuilt(layer: nn.Module, cut: Cut, out_features: int, in_features: int, bias) -> nn.Module:
    """``layer``'s form holding ``cut`` of its stored tensors."""
    if type(layer) is nn.Linear:
        return dense_linear(cut.of(layer.weight.detach()), bias)
    device = next(layer.buffers()).device
    shape = linear_shape(in_features, out_features, bias, device, layer.weight_dtype)
    if isinstance(layer, Int8WeightOnlyLinear):
        q, scale = layer.codes()  # [out, in] int8, [out] float32
        sliced = Int8WeightOnlyLinear(shape, (cut.of(q), cut.of_rows(scale)))
        sliced.set_int8_dot_rows(layer.int8_dot_rows)
        return sliced
    if isinstance(layer, Int4WeightOnlyLinear):
        if not cut.holds(layer.group_size, out_features, INT4_ROWS_MULTIPLE):
            return dense_linear(cut.of(layer.dequantized(layer.weight_dtype)), bias)
        codes, group = layer.codes(), layer.group_size
        weights = Int4Weights(cut.of(codes.q), cut.of(codes.scale, group), cut.of(codes.offset, group), group)
        sliced = Int4WeightOnlyLinear(shape, weights)
        sliced.set_int8_dot_rows(layer.int8_dot_rows)
        return sliced
    # Int8BlockLinear: always on the int8_dot kernel
    if not cut.holds(BLOCK, out_features, TILE):
        return dense_linear(cut.of(layer.dequantized(layer.weight_dtype)), bias)
    q, scale, offset = layer.codes()  # [out, in] int8, [out, in / inputs_per_scale], [out, in / 32] or None
    offset = None if offset is None else cut.of(offset, BLOCK)
    return Int8BlockLinear(shape, cut.of(q), cut.of(scale, layer.inputs_per_scale), offset)


def is_sliceable(layer: nn.Module) -> bool:
    """Whether ``layer`` is one of the forms above (exactly: a subclass may hold more than they do)."""
    return type(layer) in SLICEABLE


def _check_sliceable(layer: nn.Module) -> None:
    if not is_sliceable(layer):
        raise ValueError(f"tensor parallelism cannot slice a {type(layer).__name__}")


def dense_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An ``nn.Linear`` holding ``weight`` [out, in] (and ``bias`` [out]) as they are."""
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    out.weight = nn.Parameter(weight, requires_grad=False)  # [out, in]
    if bias is not None:
        out.bias = nn.Parameter(bias, requires_grad=False)
    return out
