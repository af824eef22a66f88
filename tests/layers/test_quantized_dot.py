"""``quantized_kernel: int8_dot``: the C++ integer-dot kernels against float64 references, the rows
independent of each other, the layers routing calls by rows, the auto choice per scheme, the setting's
errors, and speculation on a float32 target that runs them (greedy identity)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cpu_isa_builds import compile_to_assembly, cpu_flags, require_x86_64_linux_with_avx2, run_build
from factories import assert_all_pages_free, drafting_config, greedy_requests
from quantized_weights import random_linear, random_q4
from specexec.executor.executor import Executor
from specexec.executor.kernel_plan import quantized_kernel
from specexec.executor.kernel_plan.quantized_kernel import (
    QuantizedKernelChoice,
    choice_from_ratios,
    choose_quantized_kernel,
    set_int8_dot,
)
from specexec.executor.layers.cpu_kernels import cpu_kernels
from specexec.executor.layers.quantized import quantized_dot
from specexec.executor.layers.quantized.q8_block_linear import Int8BlockLinear
from specexec.executor.layers.quantized.quantization import quantize_model
from specexec.executor.layers.quantized.quantized_dot import (
    BLOCK,
    MAX_ROWS,
    pack_q4,
    pack_q5,
    pack_q8,
    q4_linear,
    q8_linear,
    tile_block_scales,
    unpack_q5,
    unpack_q8,
    untile_block_scales,
)
from specexec.executor.layers.quantized.quantized_linear import (
    DENSE_FROM_ROWS,
    Int4WeightOnlyLinear,
    Int4Weights,
    Int8WeightOnlyLinear,
)
from speculative_runs import MAX_TOKENS, num_accepted
from tiny_models import make_prompts, make_tiny_model

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SOURCE = Path(quantized_dot.__file__).with_name("quantized_dot_cpu.cpp")
#: the prefill dequantization of the same tiles, built beside it
DEQUANTIZE_SOURCE = SOURCE.with_name("q8_dequantize_cpu.cpp")


@pytest.fixture(autouse=True)
def the_ops_are_built():
    if cpu_kernels() is None:
        pytest.fail(
            "specexec's C++ CPU kernels did not build here (see the log); this machine has a compiler"
        )


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' rounding of x [M, K], step for step in float32 as they do it: int8 codes [M, K] and
    one scale per block [M, K / 32], returned in float64."""
    blocks = x.float().reshape(x.shape[0], -1, BLOCK)
    amax = blocks.abs().amax(-1)  # [M, K / 32]
    # a float32 division, as the kernel's (torch's 127 / tensor multiplies by a reciprocal instead)
    inverse = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    codes = torch.round(blocks * inverse[..., None]).clamp(-127, 127)  # half to even, as nearbyint
    return codes.reshape(x.shape).double(), (amax / 127).double()


def int8_reference(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x's int8 rounding @ weight^T, a bound on how far the kernel may be from x @ weight^T), float64."""
    codes, scale = quantize_activations(x)
    xq = (codes.reshape(x.shape[0], -1, BLOCK) * scale[..., None]).reshape(x.shape)
    blocks_abs = weight.double().abs().reshape(weight.shape[0], -1, BLOCK).sum(-1)  # [N, K / 32]
    bound = scale @ blocks_abs.t() / 2  # each block's dot is off by at most sum(|w|) * scale / 2
    return xq @ weight.double().t(), bound


CASES = [(1, 32, 8), (1, 576, 960), (3, 96, 24), (4, 64, 48), (9, 160, 40)]  # (rows, in, out)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize(("rows", "in_features", "out_features"), CASES)
def test_q4_linear_is_the_int8_rounded_product_within_its_bound(dtype, rows, in_features, out_features):
    weights = random_q4(out_features, in_features, seed=rows * in_features)
    x = (torch.randn(rows, in_features, generator=torch.Generator().manual_seed(1)) * 2).to(dtype)
    got = q4_linear(x, pack_q4(weights.q, weights.scale, weights.offset))
    assert got.dtype == dtype and got.shape == (rows, out_features)
    dense = weights.dequantize()
    rounded, bound = int8_reference(x, dense)
    # the integer dots are exact: only float sums (and the output dtype's rounding) remain
    out_rounding = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(got.double(), rounded, rtol=out_rounding, atol=1e-4)
    exact = x.double() @ dense.double().t()
    assert ((got.double() - exact).abs() <= bound + rounded.abs() * out_rounding + 1e-4).all()


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("inputs_per_scale", [None, BLOCK, BLOCK // 2], ids=["per-row", "per-32", "per-16"])
@pytest.mark.parametrize(("rows", "in_features", "out_features"), CASES)
def test_q8_linear_is_the_int8_rounded_product_within_its_bound(
    dtype, inputs_per_scale, rows, in_features, out_features
):
    gen = torch.Generator().manual_seed(out_features)
    # every int8 code, -128 too: GGUF's Q8_0 may hold it
    q = torch.randint(-128, 128, (out_features, in_features), generator=gen, dtype=torch.int8)
    per_block = inputs_per_scale is not None
    shape = (out_features, in_features // inputs_per_scale) if per_block else (out_features,)
    scale = (torch.rand(*shape, generator=gen) * 0.01).half().float()
    x = torch.randn(rows, in_features, generator=gen).to(dtype)
    x[0, :BLOCK] = -x[0, :BLOCK].abs()  # a block whose largest magnitude is negative: the sign trick
    got = q8_linear(x, pack_q8(q), tile_block_scales(scale) if per_block else scale)
    dense = q.double() * (
        scale.double().repeat_interleave(inputs_per_scale, 1) if per_block else scale.double()[:, None]
    )
    rounded, bound = int8_reference(x, dense)
    out_rounding = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(got.double(), rounded, rtol=out_rounding, atol=1e-4)
    exact = x.double() @ dense.t()
    assert ((got.double() - exact).abs() <= bound + rounded.abs() * out_rounding + 1e-4).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_width_result_is_the_float_result_rounded_as_torch_rounds(dtype):
    """The kernels write bfloat16 and float16 results straight from their float sums: the same values as
    the float32 result converted by torch (nearest, ties to even), a NaN a NaN and infinity infinity."""
    weights = random_q4(64, 96, seed=11)
    tiles = pack_q4(weights.q, weights.scale, weights.offset)
    x = (torch.randn(5, 96, generator=torch.Generator().manual_seed(4)) * 3).to(dtype)
    assert torch.equal(q4_linear(x, tiles), q4_linear(x.float(), tiles).to(dtype))
    q = torch.randint(-127, 128, (64, 96), generator=torch.Generator().manual_seed(6), dtype=torch.int8)
    scale = torch.rand(64) * 0.01
    scale[3], scale[5] = float("nan"), float("inf")
    got, want = q8_linear(x, pack_q8(q), scale), q8_linear(x.float(), pack_q8(q), scale).to(dtype)
    assert got[:, 3].isnan().all() and got[:, 5].isinf().all()
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_tiles_taken_two_at_a_time_give_each_tiles_own_result():
    """AVX-512 builds run two weight tiles (16 output rows) a pass from 16 activation rows on; a layer of
    one tile runs the one-tile pass. Each tile's slice of a 5-tile layer's output (two pairs and a last
    single tile) equals that tile alone, bit for bit, for Q4 and for int8 with a row's or a block's
    scale, at 18 rows (pairs where the build has them) and at 5 (never)."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(18, 96, generator=gen).to(torch.bfloat16)
    weights = random_q4(40, 96, seed=5)
    q4 = pack_q4(weights.q, weights.scale, weights.offset)  # [5 tiles, ...]
    whole = q4_linear(x, q4)
    assert torch.equal(whole[:5], q4_linear(x[:5], q4)), "18 rows (pairs) and 5 (none) agree"
    for t in range(5):
        assert torch.equal(whole[:, 8 * t : 8 * t + 8], q4_linear(x, q4[t : t + 1])), f"Q4 tile {t}"
    q8 = pack_q8(torch.randint(-127, 128, (40, 96), generator=gen, dtype=torch.int8))
    row_scale, block_scale = torch.rand(40, generator=gen) * 0.01, torch.rand(40, 3, generator=gen) * 0.01
    tiled = tile_block_scales(block_scale)  # [5 tiles, 3 * 8]
    whole_row, whole_block = q8_linear(x, q8, row_scale), q8_linear(x, q8, tiled)
    assert torch.equal(whole_block[:5], q8_linear(x[:5], q8, tiled))
    for t in range(5):
        rows = slice(8 * t, 8 * t + 8)
        assert torch.equal(whole_row[:, rows], q8_linear(x, q8[t : t + 1], row_scale[rows])), f"int8 tile {t}"
        assert torch.equal(whole_block[:, rows], q8_linear(x, q8[t : t + 1], tiled[t : t + 1]))


def test_each_row_is_computed_on_its_own():
    """A verify step's rows give what the same tokens give one at a time: bit for bit."""
    weights = random_q4(96, 128, seed=3)
    tiles = pack_q4(weights.q, weights.scale, weights.offset)
    x = torch.randn(7, 128, generator=torch.Generator().manual_seed(2))
    together = q4_linear(x, tiles)
    alone = torch.cat([q4_linear(x[i : i + 1], tiles) for i in range(7)])
    assert torch.equal(together, alone)
    q = pack_q8(
        torch.randint(-127, 128, (96, 128), generator=torch.Generator().manual_seed(5), dtype=torch.int8)
    )
    for scale in (torch.rand(96) * 0.01, tile_block_scales(torch.rand(96, 4) * 0.01)):
        assert torch.equal(
            q8_linear(x, q, scale), torch.cat([q8_linear(x[i : i + 1], q, scale) for i in range(7)])
        )


def test_a_zero_block_and_a_zero_row_give_zero():
    weights = random_q4(16, 64, seed=4)
    x = torch.zeros(2, 64)
    x[1, 32:] = 1.0
    got = q4_linear(x, pack_q4(weights.q, weights.scale, weights.offset))
    assert torch.equal(got[0], torch.zeros(16))
    torch.testing.assert_close(
        got[1].double(), x[1].double() @ weights.dequantize().double().t(), rtol=1e-5, atol=1e-5
    )


def test_pack_q4_interleaves_8_rows_four_inputs_a_lane():
    """Tile t, block g, vector v, byte 4i + j: row 8t + i's input 32g + 4v + j in the low nibble and its
    input 32g + 16 + 4v + j in the high one; then the 8 rows' scales and offsets (float16)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (16, 64), generator=gen, dtype=torch.uint8)
    scale, offset = torch.rand(16, 2, generator=gen), torch.rand(16, 2, generator=gen)
    tiles = pack_q4(q, scale, offset)
    assert tiles.shape == (2, 2 * 160) and tiles.dtype == torch.uint8
    for t, g, v, i, j in [(0, 0, 0, 0, 0), (1, 1, 3, 7, 3), (1, 0, 2, 5, 1), (0, 1, 1, 2, 2)]:
        byte = int(tiles[t, g * 160 + 32 * v + 4 * i + j])
        assert byte & 0x0F == q[8 * t + i, 32 * g + 4 * v + j]
        assert byte >> 4 == q[8 * t + i, 32 * g + 16 + 4 * v + j]
        halves = tiles[t, g * 160 + 128 : (g + 1) * 160].contiguous().view(torch.float16)
        assert halves[i] == scale[8 * t + i, g].half() and halves[8 + i] == offset[8 * t + i, g].half()


def test_pack_q8_and_the_tiled_scales_round_trip():
    gen = torch.Generator().manual_seed(1)
    q = torch.randint(-127, 128, (24, 96), generator=gen, dtype=torch.int8)
    tiles = pack_q8(q)
    assert tiles.shape == (3, 3 * 256)
    assert tiles[2, 256 + 32 * 5 + 4 * 6 + 1] == q[8 * 2 + 6, 32 + 4 * 5 + 1]  # tile 2, block 1, vector 5
    assert torch.equal(unpack_q8(tiles), q)
    scale = torch.rand(24, 3, generator=gen)
    assert tile_block_scales(scale)[1, 8 * 2 + 3] == scale[8 + 3, 2]
    assert torch.equal(untile_block_scales(tile_block_scales(scale)), scale)


@pytest.mark.parametrize("with_offset", [False, True])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_5_bit_tiles_give_what_the_same_codes_in_int8_tiles_give(with_offset, dtype):
    """Q5_0's codes (-16..15) and Q5_1's (0..31, with offsets) at 5 bits: unpacked in registers to the
    int8 tiles' vectors, so every row count (1..4 a pass, tile pairs from 16 rows) gives the int8 tiles'
    results bit for bit, and the prefill's dense weights too; the packing round-trips every code."""
    gen = torch.Generator().manual_seed(3)
    low = 0 if with_offset else -16
    codes = torch.randint(low, low + 32, (48, 128), generator=gen, dtype=torch.int8)
    codes[0, :32] = torch.arange(low, low + 32)  # every code once
    tiles = pack_q5(codes, with_offset)
    assert tiles.dtype == torch.uint8 and tiles.shape == (6, 4 * 160)
    assert torch.equal(unpack_q5(tiles, with_offset), codes)
    scale = tile_block_scales(torch.rand(48, 4, generator=gen) * 0.01)
    offset = tile_block_scales(torch.randn(48, 4, generator=gen) * 0.01) if with_offset else None
    for rows in (1, 2, 3, 4, 5, 16, 19):
        x = torch.randn(rows, 128, generator=gen).to(dtype)
        assert torch.equal(q8_linear(x, tiles, scale, offset), q8_linear(x, pack_q8(codes), scale, offset)), (
            rows
        )
    ops = cpu_kernels()
    assert torch.equal(
        ops.q8_dequantize(tiles, scale, offset, dtype),
        ops.q8_dequantize(pack_q8(codes), scale, offset, dtype),
    )


def test_5_bit_tiles_hold_only_codes_of_5_bits_and_a_layer_picks_them_by_its_codes():
    from specexec.executor.layers.quantized.quantized_dot import holds_five_bits

    assert holds_five_bits(torch.tensor([[-16, 15]]), with_offset=False)
    assert not holds_five_bits(torch.tensor([[-16, 16]]), with_offset=False)
    assert holds_five_bits(torch.tensor([[0, 31]]), with_offset=True)
    assert not holds_five_bits(torch.tensor([[-1, 31]]), with_offset=True)
    gen = torch.Generator().manual_seed(4)
    linear = torch.nn.Linear(64, 16, bias=False)
    scale = torch.rand(16, 2, generator=gen) * 0.01
    q5 = torch.randint(-16, 16, (16, 64), generator=gen, dtype=torch.int8)
    q8 = q5.clone()
    q8[3, 7] = 16  # one code past 5 bits: the layer keeps int8 tiles
    five, eight = Int8BlockLinear(linear, q5, scale), Int8BlockLinear(linear, q8, scale)
    assert (five.code_bits, eight.code_bits) == (5, 8)
    assert five.tiles.numel() * 256 == eight.tiles.numel() * 160
    for layer, codes in ((five, q5), (eight, q8)):
        assert torch.equal(layer.codes()[0], codes)
        want = codes.float() * scale.repeat_interleave(32, 1)
        assert torch.equal(layer.dequantized_by_torch(torch.float32), want)
        assert torch.equal(layer.dequantized(torch.float32), want)
        assert torch.equal(layer.weight_rows(torch.tensor([9, 0, 9])), want[[9, 0, 9]])
    with pytest.raises(RuntimeError, match="5-bit tiles take one scale per block"):
        q8_linear(torch.randn(1, 64), five.tiles, torch.rand(16))


def test_an_int4_layer_on_int8_dot_for_every_call_drops_torchs_copy_and_packs_it_again_when_asked():
    """int8_dot taking every row count (`MAX_ROWS`), torch's packed codes and kernel tables are dropped
    (the tiles hold the codes); the codes, the dequantized weights and every kernel's results stay what
    they were, and torch's kernel, asked for again, gets its codes packed again from the tiles."""
    gen = torch.Generator().manual_seed(5)
    linear = torch.nn.Linear(128, 48, bias=True)
    weights = random_q4(48, 128, seed=6)
    layer = Int4WeightOnlyLinear(linear, weights)
    x = torch.randn(3, 128, generator=gen)
    torch_result = layer._matmul(x)  # builds the float32 kernel table
    assert layer._scales_and_zeros
    layer.set_int8_dot_rows(16)
    packed, int8_dot_result = layer.packed.clone(), layer(x)
    layer.set_int8_dot_rows(MAX_ROWS)
    assert layer.packed is None and not layer._scales_and_zeros
    assert layer.scale is None and layer.offset is None  # float16 values (`random_q4`): the tiles hold them
    assert torch.equal(layer.codes().q, weights.q)
    assert torch.equal(layer.dequantized(torch.float32), weights.dequantize())
    assert torch.equal(layer(x), int8_dot_result)
    assert torch.equal(layer.without_int8_dot(x), torch_result)  # torch's kernel: packed again
    assert torch.equal(layer.packed, packed)
    layer.set_int8_dot_rows(MAX_ROWS)
    layer.set_int8_dot_rows(0)  # back on torch's kernel for every call: its codes are there
    assert torch.equal(layer.packed, packed) and torch.equal(layer(x), torch_result + linear.bias.detach())
    assert torch.equal(layer.scale, weights.scale) and torch.equal(layer.offset, weights.offset)
    # scales float16 does not hold (specexec's int4, Q4_K's d * scale) stay float32 beside the tiles
    exact = Int4WeightOnlyLinear(linear, Int4Weights(weights.q, weights.scale * (1 + 2**-13), weights.offset))
    exact.set_int8_dot_rows(MAX_ROWS)
    assert exact.packed is None and exact.scale is not None
    assert torch.equal(exact.codes().scale, weights.scale * (1 + 2**-13))


def test_the_kernels_refuse_shapes_they_cannot_take():
    with pytest.raises(RuntimeError, match="multiple of 32"):
        q8_linear(torch.randn(1, 48), torch.zeros(1, 256, dtype=torch.int8), torch.ones(8))
    with pytest.raises(RuntimeError, match="tiles"):
        q4_linear(torch.randn(1, 64), torch.zeros(4, 30, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="scale"):
        q8_linear(torch.randn(1, 32), torch.zeros(1, 256, dtype=torch.int8), torch.ones(4))
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        q8_linear(
            torch.randn(1, 32, dtype=torch.float64), torch.zeros(1, 256, dtype=torch.int8), torch.ones(8)
        )


# ---- the layers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_a_layer_takes_int8_dot_up_to_its_rows_and_torch_above(scheme):
    linear = random_linear(bias=True)
    layer = (Int4WeightOnlyLinear if scheme == "int4" else Int8WeightOnlyLinear)(linear)
    x = torch.randn(6, 96)
    torch_out = layer._matmul(x) + layer.bias
    layer.set_int8_dot_rows(4)
    dot_out = layer._int8_dot(x[:4]) + layer.bias
    assert torch.equal(layer(x[:4]), dot_out), "4 rows: int8_dot (bias added)"
    assert torch.equal(layer(x), torch_out), "6 rows: torch's kernel"
    assert not torch.equal(dot_out, torch_out[:4]), "the two kernels differ, so the routing above is seen"
    torch.testing.assert_close(dot_out, torch_out[:4], rtol=0.05, atol=0.02)
    layer.set_int8_dot_rows(0)
    assert torch.equal(layer(x[:4]), torch_out[:4])
    if scheme == "int4":
        assert layer._q4_codes is None, "the kernel's copy is dropped"


def test_a_layer_the_kernel_cannot_take_stays_on_torch():
    layer = Int8WeightOnlyLinear(random_linear(in_features=48, bias=True))  # 48 inputs: not blocks of 32
    assert not layer.takes_int8_dot()
    layer.set_int8_dot_rows(16)
    assert layer.int8_dot_rows == 0
    model = torch.nn.Sequential(layer)
    assert set_int8_dot([model], QuantizedKernelChoice("int8_dot", "test", 16, 16)) == 0


def test_a_q8_0_block_layer_runs_on_int8_dot_and_dequantizes_exactly():
    linear = random_linear(out_features=32, in_features=64, bias=True)
    gen = torch.Generator().manual_seed(9)
    q = torch.randint(-127, 128, (32, 64), generator=gen, dtype=torch.int8)
    scale = (torch.rand(32, 2, generator=gen) * 0.01).half().float()
    layer = Int8BlockLinear(linear, q, scale)
    dense = q.float() * scale.repeat_interleave(BLOCK, 1)
    assert torch.equal(layer.dequantized(torch.float32), dense)
    x = torch.randn(3, 64)
    assert torch.equal(layer(x), q8_linear(x, pack_q8(q), tile_block_scales(scale)) + layer.bias)
    _, bound = int8_reference(x, dense.double())
    assert ((layer(x) - layer.bias - x @ dense.t()).abs().double() <= bound + 1e-4).all()
    big = torch.randn(200, 64)  # a prefill chunk: the dequantized weights
    torch.testing.assert_close(layer(big), big @ dense.t() + layer.bias, rtol=1e-5, atol=1e-5)
    assert torch.equal(layer(x.double()), x.double() @ dense.double().t() + layer.bias.double())


# ---- the choice ------------------------------------------------------------------------------------------


def test_the_choice_takes_each_scheme_up_to_its_last_faster_count():
    choice = choice_from_ratios({"int4": {1: 0.5, 2: 0.7, 4: 0.97, 8: 0.6}, "int8": {1: 1.2, 2: 0.5}})
    assert (choice.kernel, choice.int4_rows, choice.int8_rows) == ("int8_dot", 2, 0)
    assert "int4 int8_dot up to 2 rows" in choice.reason and "int8 torch" in choice.reason
    slower = choice_from_ratios({"int4": {1: 0.99}, "int8": {1: 1.5}})
    assert (slower.kernel, slower.int4_rows, slower.int8_rows) == ("torch", 0, 0)
    everywhere = choice_from_ratios({"int4": {1: 0.04}, "int8": {1: 0.4, 64: 0.5}})
    assert (everywhere.int4_rows, everywhere.int8_rows) == (MAX_ROWS, MAX_ROWS), "past the last count"
    assert "int4 int8_dot for every call" in everywhere.reason


def test_a_clearly_faster_first_pass_ends_the_timing(monkeypatch):
    """float32's torch int4 path would take seconds a pass at 64 rows: one warm-up pass decides."""
    import time

    class Slow:
        in_features, scheme = 32, "int4"
        calls = []

        def set_int8_dot_rows(self, rows):
            pass

        def without_int8_dot(self, x):
            self.calls.append(("torch", x.shape[0]))
            time.sleep(0.02)

        def _int8_dot(self, x):
            self.calls.append(("int8_dot", x.shape[0]))
            time.sleep(0.001)

    layer = Slow()
    ratios = quantized_kernel.measure_ratios([layer], torch.float32)
    assert list(ratios) == [1] and ratios[1] < 0.25
    assert layer.calls == [("torch", 1), ("int8_dot", 1)] * 2, "an untimed warm-up, then one timed pass"


def test_one_time_work_in_the_first_call_does_not_decide(monkeypatch):
    """torch's first call per dtype builds its scale tables: a warm-up pass keeps that out."""
    import time

    class FirstCallSlow:
        in_features, scheme = 32, "int4"
        seen = 0

        def set_int8_dot_rows(self, rows):
            pass

        def without_int8_dot(self, x):
            self.seen += 1
            time.sleep(0.05 if self.seen == 1 else 0.002)

        def _int8_dot(self, x):
            time.sleep(0.002)

    ratios = quantized_kernel.measure_ratios([FirstCallSlow()], torch.float32, repeats=3)
    assert ratios[1] > 0.5, "the equal kernels are timed as equal, not 25x apart"


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_int8_dot_takes_prefill_chunks_timed_against_the_dequantized_matmul(scheme):
    """From `DENSE_FROM_ROWS` rows torch's route is the matmul on the dequantized weights: that is
    what int8_dot is timed against there, and a layer on int8_dot takes such chunks too."""
    layer = (Int4WeightOnlyLinear if scheme == "int4" else Int8WeightOnlyLinear)(random_linear(bias=True))
    small, chunk = torch.randn(4, 96), torch.randn(DENSE_FROM_ROWS + 5, 96)
    assert torch.equal(layer.without_int8_dot(small), layer._matmul(small))
    assert torch.equal(layer.without_int8_dot(chunk), chunk @ layer.dequantized(torch.float32).t())
    layer.set_int8_dot_rows(MAX_ROWS)
    assert torch.equal(layer(chunk), layer._int8_dot(chunk) + layer.bias)


def quantized_tiny(scheme="int4", dtype=torch.float32):
    _, model = make_tiny_model("llama", dtype=dtype)
    quantize_model(model, scheme)
    return model


def test_auto_measures_each_scheme_once_and_caches_it(tmp_path, monkeypatch):
    calls = []

    def fake_measure(layers, dtype, repeats=5):
        calls.append({m.scheme for m in layers})
        return {1: 0.5, 2: 0.5, 4: 2.0} if layers[0].scheme == "int4" else {1: 2.0}

    monkeypatch.setattr(quantized_kernel, "measure_ratios", fake_measure)
    model = quantized_tiny()  # int4 layers and an int8 LM head
    choice = choose_quantized_kernel("auto", model, tmp_path)
    assert (choice.kernel, choice.int4_rows, choice.int8_rows) == ("int8_dot", 2, 0)
    assert sorted(map(sorted, calls)) == [["int4"], ["int8"]]
    again = choose_quantized_kernel("auto", model, tmp_path)
    assert again == choice and len(calls) == 2, "the second start reads the cache"


def test_the_real_measurement_times_both_kernels_at_each_count():
    model = quantized_tiny()
    layers = quantized_kernel.quantized_layers(model)
    ratios = quantized_kernel.measure_ratios(
        [m for m in layers if m.scheme == "int4"], torch.float32, repeats=1
    )
    assert set(ratios) <= set(quantized_kernel.MEASURED_ROWS) and 1 in ratios
    assert all(r > 0 for r in ratios.values())


def test_configured_settings_and_their_refusals():
    model = quantized_tiny()
    assert choose_quantized_kernel("torch", model, None).kernel == "torch"
    configured = choose_quantized_kernel("int8_dot", model, None)
    assert (configured.kernel, configured.int4_rows, configured.int8_rows) == ("int8_dot", MAX_ROWS, MAX_ROWS)
    with pytest.raises(ValueError, match="'quantized_kernel': int8_dot runs on a CPU.*float64"):
        choose_quantized_kernel("int8_dot", quantized_tiny(dtype=torch.float64), None)
    assert choose_quantized_kernel("auto", quantized_tiny(dtype=torch.float64), None).kernel == "torch"
    _, dense = make_tiny_model("llama", dtype=torch.float32)
    assert "no quantized layer" in choose_quantized_kernel("auto", dense, None).reason
    with pytest.raises(ValueError, match=r"'quantized_kernel': got 'fast'; allowed: auto, torch, int8_dot"):
        drafting_config(quantized_kernel="fast")


# ---- an executor on it: speculation keeps the greedy output ----------------------------------------------


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_speculation_on_an_int8_dot_target_keeps_its_greedy_output(scheme):
    """float32 target whose calls all run on int8_dot (configured: every call, prefill included): NGram
    drafts change nothing, as each row's output depends on that row alone; requests
    one at a time and four together."""
    prompts = make_prompts(8, (5, 12, 3, 20), seed=4)
    prompts = [p + p[:6] for p in prompts]  # repeats for NGram to draft from

    def run(spec):
        _, model = make_tiny_model("llama", dtype=torch.float32)
        config = drafting_config(
            dtype="float32",
            quantization=scheme,
            quantized_kernel="int8_dot",
            speculative_config=spec,
            max_batch_size=4,
        )
        with Executor(model, config) as executor:
            assert executor.setup.quantized_kernel.kernel == "int8_dot"
            layers = quantized_kernel.quantized_layers(executor.model)
            assert layers and all(m.int8_dot_rows == MAX_ROWS for m in layers)
            alone = [executor.run(greedy_requests([p], MAX_TOKENS))[0] for p in prompts]
            together = executor.run(greedy_requests(prompts[:4], MAX_TOKENS))
            assert_all_pages_free(executor)
        return alone, together

    plain = run(None)
    drafted = run({"decoding_type": "NGram", "max_draft_len": 3})
    for got, want in zip(drafted, plain):
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert num_accepted(drafted[0]) > 0


def test_a_float32_executor_with_torch_keeps_torch_kernels():
    _, model = make_tiny_model("llama", dtype=torch.float32)
    with Executor(
        model, drafting_config(dtype="float32", quantization="int4", quantized_kernel="torch")
    ) as ex:
        assert ex.setup.quantized_kernel.kernel == "torch"
        assert all(m.int8_dot_rows == 0 for m in quantized_kernel.quantized_layers(ex.model))


# ---- the AVX2, AVX-VNNI and plain C++ paths, built apart (this CPU may run the AVX-512 one) --------------

ISA_BODY = """
x, q8, row_scale, block_scale, half_block_scale, q4, block_offset, five, float16_cases = inputs
result = {"isa": ops.quantized_dot_isa(), "q8": ops.q8_linear(x, q8, block_scale),
          "q8_row": ops.q8_linear(x, q8, row_scale), "q8_half": ops.q8_linear(x, q8, half_block_scale),
          "q8_offset": ops.q8_linear(x, q8, half_block_scale, block_offset), "q4": ops.q4_linear(x, q4),
          "dense": ops.q8_dequantize(q8, half_block_scale, block_offset, torch.bfloat16)}
for name, (tiles, as_int8, offset) in five.items():  # 5-bit tiles against the same codes in int8 tiles
    result[name] = (ops.q8_linear(x, tiles, block_scale, offset), ops.q8_linear(x, as_int8, block_scale, offset),
                    ops.q8_dequantize(tiles, block_scale, offset, torch.bfloat16),
                    ops.q8_dequantize(as_int8, block_scale, offset, torch.bfloat16))
result["float16_scales"] = {  # float16 block scales against the same values in float32
    name: (ops.q8_linear(x, t, s, o), ops.q8_linear(x, t, s.float(), o),
           ops.q8_dequantize(t, s, o, torch.bfloat16), ops.q8_dequantize(t, s.float(), o, torch.bfloat16))
    for name, (x, t, s, o) in float16_cases.items()}
"""
NAN_ROW = 5  #: the row of `isa_inputs` that holds a NaN


def isa_inputs():
    """Activations with a block whose largest magnitude is negative (AVX2's sign trick) and a row with a
    NaN; int8 codes with -128 among them (GGUF's Q8_0 allows it: AVX2 must not negate it to itself);
    and the float64 references of the finite rows."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 96, generator=gen)
    x[0, :BLOCK] = -x[0, :BLOCK].abs()
    x[NAN_ROW, 50] = float("nan")
    q = torch.randint(-128, 128, (40, 96), generator=gen, dtype=torch.int8)
    q[::3, ::5] = -128
    row_scale, block_scale = torch.rand(40, generator=gen) * 0.01, torch.rand(40, 3, generator=gen) * 0.01
    half_block_scale = torch.rand(40, 6, generator=gen) * 0.01  # GGUF's Q6_K: a scale per 16 inputs
    block_offset = torch.randn(40, 3, generator=gen) * 0.01  # GGUF's Q5_1 and Q5_K: an offset per 32
    weights = random_q4(40, 96, seed=1)
    five = {}  # Q5_0's codes (-16..15, no offsets) and Q5_1's (0..31, offsets), as 5-bit and int8 tiles
    for name, low, offset in (("q5", -16, None), ("q5_offset", 0, tile_block_scales(block_offset))):
        codes = torch.randint(low, low + 32, (40, 96), generator=gen, dtype=torch.int8)
        five[name] = (pack_q5(codes, offset is not None), pack_q8(codes), offset)
    inputs = (
        x,
        pack_q8(q),
        row_scale,
        tile_block_scales(block_scale),
        tile_block_scales(half_block_scale),
        pack_q4(weights.q, weights.scale, weights.offset),
        tile_block_scales(block_offset),
        five,
        float16_scale_cases(x, q, five, gen),
    )
    finite = x[:NAN_ROW]
    half_weights = q.double() * half_block_scale.double().repeat_interleave(16, 1)
    references = {
        "q8": int8_reference(finite, q.double() * block_scale.double().repeat_interleave(BLOCK, 1))[0],
        "q8_row": int8_reference(finite, q.double() * row_scale.double()[:, None])[0],
        "q8_half": int8_reference(finite, half_weights)[0],
        "q4": int8_reference(finite, weights.dequantize())[0],
        "q8_offset": int8_reference(finite, half_weights + block_offset.double().repeat_interleave(BLOCK, 1))[
            0
        ],
        # a prefill chunk's dense weights: torch's q * scale + offset in float32, to bfloat16, exactly
        "dense": (
            q.float() * half_block_scale.repeat_interleave(16, 1) + block_offset.repeat_interleave(BLOCK, 1)
        ).bfloat16(),
    }
    return inputs, references


def float16_scale_cases(x, q, five, gen) -> dict:
    """(x, tiles, float16 block scales, offsets) for int8 and 5-bit tiles, with and without offsets, at 6
    rows and at 17 (AVX-512 builds take tile pairs from 16 rows)."""
    scale = (torch.rand(40, 3, generator=gen) * 0.01).half()  # every value exact in float16, as GGUF's d
    x17 = torch.cat([x, torch.randn(11, 96, generator=gen)])
    cases = {}
    for rows, activations in (("6", x), ("17", x17)):
        cases[f"int8, {rows} rows"] = (activations, pack_q8(q), tile_block_scales(scale).half(), None)
        for name, (tiles, _, offset) in five.items():
            cases[f"{name}, {rows} rows"] = (activations, tiles, tile_block_scales(scale).half(), offset)
    return cases


def assert_float16_scales_give_the_float32_results(cases: dict) -> None:
    for name, (with_half, with_float, dense_half, dense_float) in cases.items():
        assert torch.equal(with_half.nan_to_num(7.0), with_float.nan_to_num(7.0)), name
        assert with_half[NAN_ROW].isnan().all(), name
        assert torch.equal(dense_half, dense_float), name


def assert_isa_results(got: dict, references: dict) -> None:
    assert_float16_scales_give_the_float32_results(got["float16_scales"])
    for name in ("q5", "q5_offset"):  # the same codes at 5 bits and at 8: the same results, bit for bit
        five, eight, five_dense, eight_dense = got[name]
        assert torch.equal(five.nan_to_num(7.0), eight.nan_to_num(7.0)) and five[NAN_ROW].isnan().all(), name
        assert torch.equal(five_dense, eight_dense), name
    for name, want in references.items():
        if name == "dense":
            assert torch.equal(got[name], want), "the dense weights, bit for bit"
            continue
        torch.testing.assert_close(
            got[name][:NAN_ROW].double(), want, rtol=1e-5, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}"
        )
        assert got[name][NAN_ROW].isnan().all(), f"{name}: the NaN row must come out NaN"


def test_float16_block_scales_give_the_float32_results_bit_for_bit_on_this_build():
    ops = cpu_kernels()  # (built: the file's fixture fails where they do not)
    *_, float16_cases = isa_inputs()[0]
    cases = {
        name: (
            ops.q8_linear(x, t, s, o),
            ops.q8_linear(x, t, s.float(), o),
            ops.q8_dequantize(t, s, o, torch.bfloat16),
            ops.q8_dequantize(t, s.float(), o, torch.bfloat16),
        )
        for name, (x, t, s, o) in float16_cases.items()
    }
    assert_float16_scales_give_the_float32_results(cases)


def test_float16_scales_are_kept_only_where_they_hold_every_scale_exactly():
    linear = random_linear(out_features=16, in_features=64, bias=True)
    q = torch.randint(-16, 16, (16, 64), generator=torch.Generator().manual_seed(2), dtype=torch.int8)
    exact = torch.full((16, 2), 2.0**-10)
    assert Int8BlockLinear(linear, q, exact).tiled_scale.dtype == torch.float16
    assert Int8BlockLinear(linear, q, exact + 1e-7).tiled_scale.dtype == torch.float32
    assert (
        Int8BlockLinear(linear, q, torch.full((16, 4), 2.0**-10)).tiled_scale.dtype == torch.float32
    )  # per 16
    layer = Int8BlockLinear(linear, q, exact)
    assert layer.codes()[1].dtype == torch.float32 and torch.equal(layer.codes()[1], exact)
    assert torch.equal(layer.dequantized_by_torch(torch.float32), q.float() * 2.0**-10)
    assert torch.equal(layer.weight_rows(torch.tensor([3, 11])), q[[3, 11]].float() * 2.0**-10)


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "isa"), [(["-march=x86-64-v3"], "avx2"), (["-march=x86-64"], "scalar")])
def test_the_avx2_and_plain_builds_give_the_reference_results(tmp_path, flags, isa):
    require_x86_64_linux_with_avx2()
    inputs, references = isa_inputs()
    got = run_build(tmp_path, [SOURCE, DEQUANTIZE_SOURCE], flags, inputs, ISA_BODY)
    assert got["isa"] == isa
    assert_isa_results(got, references)


@pytest.mark.slow
def test_the_avx_vnni_build_compiles_to_its_dot_product_and_runs_where_the_cpu_has_it(tmp_path):
    """AVX-VNNI (the 256-bit VEX ``vpdpbusd`` of Alder Lake and later; AVX512-VNNI implies nothing about
    it) is compiled on any x86-64 machine; it runs only where /proc/cpuinfo lists avx_vnni."""
    require_x86_64_linux_with_avx2()
    flags = ["-march=x86-64-v3", "-mavxvnni"]
    assembly = compile_to_assembly(tmp_path, SOURCE, flags)
    assert "{vex} vpdpbusd" in assembly, "the AVX-VNNI branch, not AVX2's, must be what this build runs"
    if "avx_vnni" in cpu_flags():
        inputs, references = isa_inputs()
        got = run_build(tmp_path, [SOURCE, DEQUANTIZE_SOURCE], flags, inputs, ISA_BODY)
        assert got["isa"] == "avx_vnni"
        assert_isa_results(got, references)


def test_the_choice_says_a_q8_0_layer_runs_on_int8_dot_whatever_it_chose(tmp_path):
    model = quantized_tiny()
    linear = random_linear(out_features=32, in_features=64, bias=True)
    q = torch.randint(-127, 128, (32, 64), generator=torch.Generator().manual_seed(1), dtype=torch.int8)
    model.lm_head = Int8BlockLinear(linear, q, torch.full((32, 2), 0.01))
    for setting in ("torch", "int8_dot"):
        assert (
            "1 int8-block layer (GGUF Q8_0, Q5_0, Q6_K, Q5_1, Q5_K) on int8_dot"
            in choose_quantized_kernel(setting, model, tmp_path).reason
        )


def test_a_self_drafts_int8_layers_get_their_own_choice():
    """A dense float32 target with the int8 self-draft: the target has nothing to route, the draft's
    layers are chosen and routed on their own (here configured: int8_dot)."""
    _, model = make_tiny_model("llama", dtype=torch.float32)
    spec = {"decoding_type": "DraftTarget", "max_draft_len": 3, "quantization": "int8"}
    config = drafting_config(dtype="float32", quantized_kernel="int8_dot", speculative_config=spec)
    with Executor(model, config) as executor:
        assert "no quantized layer" in executor.setup.quantized_kernel.reason
        draft = executor.speculation.drafter.runner.model
        layers = quantized_kernel.quantized_layers(draft)
        assert layers and all(m.int8_dot_rows == MAX_ROWS for m in layers)
        outputs = executor.run(greedy_requests(make_prompts(2, (5, 9), seed=3), MAX_TOKENS))
        assert all(len(o.token_ids) > 0 for o in outputs)
        assert_all_pages_free(executor)
