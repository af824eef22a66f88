"""A GGUF's Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K and Q8_0 tensors at their own codes: decoded from random blocks
written here (no downloads), they equal the `gguf` package's own dequantization bit for bit; Q4_K's
scales and offsets, rounded to float16 in the int4 kernels' tiles, stay within the stated bound; and a
model holding such tensors loads them into the int4 and int8-block layers, not dense weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf_blocks import FakeFile, gguf_dequantized, random_tensor
from specexec.executor.layers.quantized import quantization
from specexec.executor.layers.quantized.gguf_weights import (
    Q4_K_TILE_ERROR,
    GGUFTensor,
)
from specexec.executor.layers.quantized.q8_block_linear import Int8BlockLinear
from specexec.executor.layers.quantized.quantization import QuantizationReport
from specexec.executor.layers.quantized.quantized_dot import MAX_ROWS
from specexec.executor.layers.quantized.quantized_linear import Int4WeightOnlyLinear
from torch import nn


def bits(t: torch.Tensor) -> torch.Tensor:
    return (t + 0.0).view(torch.int32)  # (-0.0 as +0.0, as `match_rows` compares)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q4_K"])
def test_int4_codes_equal_the_gguf_packages_dequantization(type_name):
    tensor = random_tensor(type_name, 16, 512)
    codes = tensor.decode()
    assert codes.q.dtype == torch.uint8 and int(codes.q.max()) <= 15 and codes.group_size == 32
    assert torch.equal(bits(codes.dequantize()), bits(gguf_dequantized(tensor)))


@pytest.mark.parametrize("type_name", ["Q8_0", "Q5_0", "Q6_K", "Q5_1", "Q5_K"])
def test_int8_block_codes_equal_the_gguf_packages_dequantization(type_name):
    tensor = random_tensor(type_name, 16, 512)
    q, scale, offset = tensor.decode_int8_blocks()
    inputs_per_scale = 16 if type_name == "Q6_K" else 32
    assert q.dtype == torch.int8 and scale.shape == (16, 512 // inputs_per_scale)
    if type_name == "Q5_0":
        assert int(q.min()) >= -16 and int(q.max()) <= 15 and len(q.unique()) == 32  # every 5-bit code
    if type_name in ("Q5_1", "Q5_K"):  # uncentred: the offset carries the rest
        assert int(q.min()) >= 0 and int(q.max()) <= 31 and len(q.unique()) == 32
        assert offset.shape == (16, 512 // 32) and offset.dtype == torch.float32
    else:
        assert offset is None
    if type_name == "Q6_K":
        assert int(q.min()) >= -32 and int(q.max()) <= 31 and len(q.unique()) == 64  # every 6-bit code
    dequantized = q.float() * scale.repeat_interleave(inputs_per_scale, dim=1)
    if offset is not None:
        dequantized = dequantized + offset.repeat_interleave(32, dim=1)
    assert torch.equal(bits(dequantized), bits(gguf_dequantized(tensor)))


def test_types_without_a_layout_are_refused_by_the_decoders():
    with pytest.raises(quantization.QuantizationError, match="Q5_0 has no int4 kernel layout"):
        random_tensor("Q5_0", 8, 64).decode()
    with pytest.raises(quantization.QuantizationError, match="Q4_K has no int8-block kernel layout"):
        random_tensor("Q4_K", 8, 256).decode_int8_blocks()
    with pytest.raises(quantization.QuantizationError, match="Q6_K has no int4 kernel layout"):
        random_tensor("Q6_K", 8, 256).decode()


def test_q4_k_weights_in_the_float16_tiles_stay_within_the_stated_bound():
    """What the int8_dot tiles hold: q * fp16(scale) + fp16(offset), each rounded once with relative
    error at most 2^-11 (plus float16's subnormal step for tiny values)."""
    tensor = random_tensor("Q4_K", 32, 1024, seed=1)
    codes = tensor.decode()
    scale = codes.scale.half().float().repeat_interleave(32, dim=1)
    offset = codes.offset.half().float().repeat_interleave(32, dim=1)
    held = codes.q.float() * scale + offset
    exact = gguf_dequantized(tensor)
    exact_scale = codes.scale.repeat_interleave(32, dim=1)
    exact_offset = codes.offset.repeat_interleave(32, dim=1)
    bound = Q4_K_TILE_ERROR * (codes.q.float() * exact_scale.abs() + exact_offset.abs()) + 16 * 2.0**-24
    assert ((held - exact).abs() <= bound).all()
    assert not torch.equal(held, exact)  # the rounding is real: the bound is what is claimed


class TwoLayers(nn.Module):
    """The least a GGUF install walks: an embedding and the linear layers whose weights it replaces."""

    def __init__(self, in_features: int = 512, out_features: int = 64):
        super().__init__()
        self.embed = nn.Embedding(8, in_features)
        self.a = nn.Linear(in_features, out_features, bias=False)
        self.b = nn.Linear(in_features, out_features, bias=False)

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def forward(self, x):
        return self.a(x), self.b(x)


def installed_two_layers(
    type_a: str, type_b: str, int8_dot: bool
) -> tuple[TwoLayers, dict, QuantizationReport]:
    """A float32 model whose layers hold two random tensors' dequantized weights (as transformers
    converts them), installed at the tensors' codes."""
    model = TwoLayers()
    tensors = {"a": random_tensor(type_a, 64, 512, seed=2), "b": random_tensor(type_b, 64, 512, seed=3)}
    dense = {name: gguf_dequantized(t) for name, t in tensors.items()}
    with torch.no_grad():
        for name, weight in dense.items():
            getattr(model, name).weight.copy_(weight)
    report = QuantizationReport("gguf")
    quantization._install_gguf(model, FakeFile(tensors), report, int8_dot)
    return model, dense, report


def test_q4_k_and_q5_0_layers_load_at_their_codes_where_int8_dot_runs(cpu_ops_built):
    model, dense, report = installed_two_layers("Q4_K", "Q5_0", int8_dot=True)
    assert dict(report.layers) == {
        "Q4_K -> int4 (Q4_K scales to float16 in the kernels)": 1,
        "Q5_0 -> int8 blocks (exact)": 1,
    }
    assert isinstance(model.a, Int4WeightOnlyLinear) and isinstance(model.b, Int8BlockLinear)
    # the layers hold the file's weights exactly (float32 scales and offsets)
    assert torch.equal(model.a.dequantized(torch.float32), dense["a"])
    assert torch.equal(model.b.dequantized(torch.float32), dense["b"])
    # and the int8_dot kernels multiply by them, up to the activations' int8 rounding
    model.a.set_int8_dot_rows(MAX_ROWS)
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(4))
    for layer, name in ((model.a, "a"), (model.b, "b")):
        want = x @ dense[name].T
        got = layer(x)
        assert (got - want).norm() / want.norm() < 0.02


def test_q6_k_layers_and_a_layer_fusing_q6_k_with_q5_0_load_at_their_codes(cpu_ops_built):
    model, dense, report = installed_two_layers("Q6_K", "Q6_K", int8_dot=True)
    assert dict(report.layers) == {"Q6_K -> int8 blocks (exact)": 2}
    assert isinstance(model.a, Int8BlockLinear) and model.a.inputs_per_scale == 16
    assert torch.equal(model.a.dequantized(torch.float32), dense["a"])
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(6))
    want = x @ dense["a"].T
    assert (model.a(x) - want).norm() / want.norm() < 0.02
    # a fused layer (the own decoder's gate/up) whose parts are Q6_K and Q5_0: one scale per 16 for both
    tensors = [random_tensor("Q6_K", 64, 512, seed=7), random_tensor("Q5_0", 64, 512, seed=8)]
    weight = torch.cat([gguf_dequantized(t) for t in tensors])
    q, scale, offset = quantization._stored_int8_blocks(tensors, weight)
    assert q.shape == (128, 512) and scale.shape == (128, 32) and offset is None
    assert torch.equal(q.float() * scale.repeat_interleave(16, dim=1), weight)


def test_q5_k_and_q5_1_layers_load_at_their_codes_with_offsets(cpu_ops_built):
    model, dense, report = installed_two_layers("Q5_K", "Q5_1", int8_dot=True)
    assert dict(report.layers) == {"Q5_K -> int8 blocks (exact)": 1, "Q5_1 -> int8 blocks (exact)": 1}
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(9))
    for name in ("a", "b"):
        layer = getattr(model, name)
        assert isinstance(layer, Int8BlockLinear) and layer.tiled_offset is not None
        assert torch.equal(layer.dequantized(torch.float32), dense[name]), "the file's weights exactly"
        want = x @ dense[name].T
        got = layer(x)
        assert (got - want).norm() / want.norm() < 0.02
        # the int8 step's bound: |error| <= sum over blocks of sum(|w|) * xd / 2, per output
        blocks = x.reshape(5, 16, 32)
        xd = blocks.abs().amax(-1) / 127  # [rows, blocks]
        weight_mass = dense[name].abs().reshape(64, 16, 32).sum(-1)  # [out, blocks]
        bound = (xd @ weight_mass.T) / 2 + 1e-4 * want.abs() + 1e-5
        assert ((got - want).abs() <= bound).all()


def test_a_fused_layer_mixing_q4_k_with_q6_k_loads_as_int8_blocks_not_dense(cpu_ops_built):
    """A Q4_K_M file's q/k/v where attn_v took Q6_K ("more bits"): one fused layer, its Q4_K rows as int8
    codes 0..15 with their scale and offset, exactly the file's weights (it was dense)."""

    class Fused(nn.Module):  # as the own decoder fuses checkpoint layers (`checkpoint_names`)
        checkpoint_names = {"qkv": ("q", "v")}

        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(512, 128, bias=False)

    model = TwoLayers()
    model.layer = Fused()
    tensors = {
        "layer.q": random_tensor("Q4_K", 64, 512, seed=14),
        "layer.v": random_tensor("Q6_K", 64, 512, seed=15),
    }
    weight = torch.cat([gguf_dequantized(t) for t in tensors.values()])
    with torch.no_grad():
        model.layer.qkv.weight.copy_(weight)
    report = QuantizationReport("gguf")
    quantization._install_gguf(model, FakeFile(tensors), report, int8_dot=True)
    assert report.layers["Q4_K/Q6_K -> int8 blocks (exact)"] == 2
    layer = model.layer.qkv
    assert isinstance(layer, Int8BlockLinear) and layer.inputs_per_scale == 16
    q, scale, offset = layer.codes()
    assert int(q[:64].min()) >= 0 and int(q[:64].max()) <= 15 and bool((offset[64:] == 0).all())
    assert torch.equal(layer.dequantized(torch.float32), weight)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(16))
    want = x @ weight.T
    assert (layer(x) - want).norm() / want.norm() < 0.02


def test_a_layer_fusing_q5_k_with_q6_k_gives_the_q6_k_part_zero_offsets(cpu_ops_built):
    """A Q5_K_M file's fused gate/up or q/k/v mixes Q5_K with Q6_K: one layer, a scale per 16 for all,
    offsets where Q5_K has them and 0 for Q6_K's rows."""
    tensors = [random_tensor("Q5_K", 64, 512, seed=10), random_tensor("Q6_K", 64, 512, seed=11)]
    weight = torch.cat([gguf_dequantized(t) for t in tensors])
    q, scale, offset = quantization._stored_int8_blocks(tensors, weight)
    assert scale.shape == (128, 32) and offset.shape == (128, 16)
    assert bool((offset[:64] != 0).any()) and bool((offset[64:] == 0).all())
    linear = nn.Linear(512, 128, bias=False)
    layer = Int8BlockLinear(linear, q, scale, offset)
    assert torch.equal(layer.dequantized(torch.float32), weight)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(12))
    want = x @ weight.T
    assert (layer(x) - want).norm() / want.norm() < 0.02


def test_without_int8_dot_q5_0_stays_dense_and_q4_k_takes_torchs_int4_kernel():
    model, _, report = installed_two_layers("Q4_K", "Q5_0", int8_dot=False)
    assert dict(report.layers) == {
        "Q4_K -> int4 (Q4_K scales to float16 in the kernels)": 1,
        "Q5_0 -> dense": 1,
    }
    assert type(model.b) is nn.Linear


def test_a_q4_k_scale_beyond_float16_keeps_the_layer_dense():
    """No silent Inf in the kernels' tiles: such a layer stays dense."""
    model = TwoLayers()
    tensor = random_tensor("Q4_K", 64, 512, seed=5)
    raw = tensor.blocks.reshape(64, 2, 144).copy()
    raw[0, 0, 0:2] = np.array([60000.0], dtype=np.float16).view(np.uint8)  # d * scale_j overflows float16
    tensor = GGUFTensor(tensor.name, "Q4_K", tensor.shape, raw.reshape(64, -1))
    with torch.no_grad():
        model.a.weight.copy_(gguf_dequantized(tensor))
    report = QuantizationReport("gguf")
    quantization._install_gguf(model, FakeFile({"a": tensor}), report, int8_dot=False)
    assert report.layers["Q4_K -> dense"] == 1 and type(model.a) is nn.Linear


@pytest.mark.parametrize("layout", ["per 32", "per 16", "per 32 with offsets", "per 16 with offsets"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_dense_weights_for_prefill_equal_torchs_dequantization_bit_for_bit(cpu_ops_built, layout, dtype):
    """A prefill chunk's weights come from one C++ pass (`q8_dequantize`), not six torch ops: the same
    values, rounded the same way, for every layout an int8-block layer holds."""
    generator = torch.Generator().manual_seed(17)
    q = torch.randint(-128, 128, (48, 256), generator=generator, dtype=torch.int8)
    per = 16 if "16" in layout else 32
    scale = torch.randn(48, 256 // per, generator=generator) * 0.01
    offset = torch.randn(48, 256 // 32, generator=generator) * 0.01 if "offsets" in layout else None
    layer = Int8BlockLinear(nn.Linear(256, 48, bias=False), q, scale, offset)
    got, want = layer.dequantized(dtype), layer.dequantized_by_torch(dtype)
    assert got.dtype == dtype and torch.equal(bits(got.float()), bits(want.float()))
