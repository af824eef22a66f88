"""A tensor-parallel rank's slices of a linear layer, in every form a layer takes (dense, int8 per row,
int4 in groups, a GGUF's Q8_0 blocks): row slices give exactly those outputs, column slices summed give
the whole layer's output, the codes are the layer's own, and a slice a kernel cannot hold is held dense
with the same values."""

from __future__ import annotations

import pytest
import torch
from specexec.executor.layers.cpu_kernels import cpu_kernels
from specexec.executor.layers.quantized.q8_block_linear import Int8BlockLinear
from specexec.executor.layers.quantized.quantized_linear import (
    Int4WeightOnlyLinear,
    Int8WeightOnlyLinear,
)
from specexec.executor.parallel.weight_slices import is_held_dense, take_columns, take_rows
from torch import nn

IN, OUT = 128, 96


def make_layer(form: str, dtype=torch.float64) -> nn.Module:
    torch.manual_seed(3)
    linear = nn.Linear(IN, OUT, bias=True).to(dtype).requires_grad_(False)
    if form == "dense":
        return linear
    if form == "int8":
        return Int8WeightOnlyLinear(linear)
    if form == "int4":
        return Int4WeightOnlyLinear(linear)
    if cpu_kernels() is None:
        pytest.fail(
            "specexec's C++ CPU kernels did not build here (see the log); this machine has a compiler"
        )
    if form == "q6_k":  # codes q - 32, a scale per 16 inputs
        q = torch.randint(-32, 32, (OUT, IN), dtype=torch.int8)
        return Int8BlockLinear(linear, q, torch.rand(OUT, IN // 16) * 0.01)
    if form == "q5_k":  # codes 0..31 with a scale and an offset per 32 inputs (5-bit tiles)
        q = torch.randint(0, 32, (OUT, IN), dtype=torch.int8)
        return Int8BlockLinear(linear, q, torch.rand(OUT, IN // 32) * 0.01, torch.randn(OUT, IN // 32) * 0.01)
    if form == "q5_0":  # codes -16..15 with a scale per 32 inputs (5-bit tiles)
        q = torch.randint(-16, 16, (OUT, IN), dtype=torch.int8)
        return Int8BlockLinear(linear, q, torch.rand(OUT, IN // 32) * 0.01)
    q = torch.randint(-127, 128, (OUT, IN), dtype=torch.int8)
    return Int8BlockLinear(linear, q, torch.rand(OUT, IN // 32) * 0.01)


def dense_weight(layer: nn.Module) -> torch.Tensor:  # [out, in] float64
    if type(layer) is nn.Linear:
        return layer.weight.double()
    return layer.dequantized(torch.float64)


FORMS = ["dense", "int8", "int4", "q8_0", "q6_k", "q5_k", "q5_0"]


@pytest.mark.parametrize("form", FORMS)
def test_row_slices_hold_those_rows_in_the_same_form(form):
    layer = make_layer(form)
    ranges = [(16, 48), (64, 80)]
    sliced = take_rows(layer, ranges)
    assert type(sliced) is type(layer) and sliced.out_features == 48
    rows = torch.cat([torch.arange(a, b) for a, b in ranges])
    assert torch.equal(dense_weight(sliced), dense_weight(layer)[rows])
    assert torch.equal(sliced.bias, layer.bias[rows])
    x = torch.randn(3, IN, dtype=torch.float64)
    torch.testing.assert_close(sliced(x), layer(x)[:, rows], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", FORMS)
def test_column_slices_summed_give_the_whole_layer(form):
    layer = make_layer(form)
    parts = [take_columns(layer, start, start + 64, keep_bias=start == 0) for start in (0, 64)]
    assert [type(p) for p in parts] == [type(layer)] * 2
    assert parts[0].bias is not None and parts[1].bias is None, "the bias is added once"
    x = torch.randn(5, IN, dtype=torch.float64)
    total = parts[0](x[:, :64]) + parts[1](x[:, 64:])
    torch.testing.assert_close(total, layer(x), rtol=1e-10, atol=1e-10)
    assert torch.equal(torch.cat([dense_weight(p) for p in parts], dim=1), dense_weight(layer))


def test_the_heads_last_rank_is_padded_with_zero_rows():
    layer = make_layer("int4")
    sliced = take_rows(layer, [(64, OUT)], pad_to=48)
    assert sliced.out_features == 48 and type(sliced) is Int4WeightOnlyLinear
    weight = dense_weight(sliced)
    assert torch.equal(weight[:32], dense_weight(layer)[64:]) and not weight[32:].any()


@pytest.mark.parametrize("form", ["int4", "q8_0", "q6_k"])
def test_a_slice_the_kernel_cannot_hold_is_held_dense_with_the_same_values(form):
    layer = make_layer(form)
    within_a_group = take_columns(layer, 0, 48, keep_bias=True)  # 48: not a multiple of 32
    too_few_rows = take_rows(layer, [(0, 4)])  # 4 rows: not a multiple of the kernels' tiles
    for sliced, want in [
        (within_a_group, dense_weight(layer)[:, :48]),
        (too_few_rows, dense_weight(layer)[:4]),
    ]:
        assert is_held_dense(layer, sliced)
        assert torch.equal(sliced.weight.double(), want)
    assert not is_held_dense(make_layer("dense"), take_rows(make_layer("dense"), [(0, 4)]))


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_a_slice_keeps_the_layers_int8_dot_routing(form):
    if cpu_kernels() is None:
        pytest.fail(
            "specexec's C++ CPU kernels did not build here (see the log); this machine has a compiler"
        )
    layer = make_layer(form, torch.float32)
    layer.set_int8_dot_rows(8)
    assert take_rows(layer, [(0, 32)]).int8_dot_rows == 8
    assert take_columns(layer, 32, 96, keep_bias=False).int8_dot_rows == 8


def test_a_layer_of_another_kind_is_refused():
    with pytest.raises(ValueError, match="cannot slice a Identity"):
        take_rows(nn.Identity(), [(0, 4)])
