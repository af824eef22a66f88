"""``quantized_kernel:`` — which kernel runs a CPU model's quantized linear layers (int4, int8, GGUF) for
decode and verify steps and prefill chunks.

- ``torch``: torch's weight-only kernels (`quantized_linear.py`): activations stay in the model's dtype,
  exact in float32 against the dequantized weights.
- ``int8_dot``: specexec's C++ kernels (`quantized_dot_cpu.cpp`), llama.cpp's way: each activation row
  quantized to int8 in blocks of 32, integer dot products (AVX512-VNNI / AVX-VNNI ``dpbusd``, else AVX2),
  one float scale per block. It reads the codes as stored (4-bit codes 16 bytes a block of 32, int8
  codes 32), interleaved 8 weight rows to a tile so that one integer dot product serves 8 rows, where
  torch's int4 kernel dequantizes each weight before a float multiply. The one
  extra rounding is the activations' int8 step (a block's dot is off by at most sum(|w|) * scale / 2;
  `tests/test_quantized_dot.py`). Each row is quantized on its own, so a row's output does not depend on
  the other rows of the call (a verify step's rows equal the same tokens decoded one at a time). It
  takes prefill chunks too: from 128 rows torch's route dequantizes a layer's weights for one dense
  matmul, which int8_dot beat at 128 and 512 rows (float32: 2-13x; bfloat16: 1.0-3.4x).
- ``auto``: on a CPU where the C++ kernels load, each scheme's layers (int4 and int8 apart: a GGUF's
  Q4_1 layers, its int8 LM head) are run once each, in order (a step's weight traffic), under both
  kernels at each of `MEASURED_ROWS` rows (torch's side as its route runs them: its kernel, or from 128
  rows the dequantized weights' matmul), taking turns; ``int8_dot`` takes a scheme's rows up to the
  last count where it needs under `MARGIN` of torch's time, every smaller count included (all of them:
  every call). Cached per
  CPU, torch, threads, dtype and the layers' shapes. Elsewhere: ``torch``.

What it bought (2-core AMD EPYC Zen 4, AVX512-VNNI; `bench/reports/2026-11-27-int8-dot/`,
`2026-11-27-int8-tiles/`): torch's int4 kernel is 25-60x slower in float32 (the dtype of CPUs without
native bfloat16); in bfloat16 the tiles take 0.55-0.71x its time at one row and 0.60x at 4 over
SmolLM2's layers; torch's int8 kernel takes 3x int8_dot's first layout's time for the 49152x576 LM
head.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from ..cpu_info import describe_cpu
from ..cpu_kernels import cpu_kernels, fused_ops_take
from ..measurement.measurement_cache import cached_row_ratios, interleaved_medians, machine_key

QUANTIZED_KERNELS = ("auto", "torch", "int8_dot")
BLOCK = 32  #: inputs per activation scale (and per Q4 scale): the kernels need in_features in multiples
HALF_BLOCK = 16  #: inputs per weight scale of int8 codes with half-block scales (GGUF's Q6_K)
TILE = 8  #: weight rows the kernels' tiles interleave: they need out_features in multiples
#: rows per timed pass: decode, verify of 1 + k at batch 1-4, larger batches, prefill chunks
MEASURED_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 512)
#: "every call" (``int8_dot`` configured, or faster at every measured count)
MAX_ROWS = 2**62
MARGIN = 0.95  #: int8_dot must take under this fraction of torch's time at a row count to be chosen
CLEARLY_SLOWER = 1.5  #: at this ratio larger row counts are not timed (they only get slower)
#: at this ratio in the warm-up pass, int8_dot is taken for this count and every larger one untimed:
#: torch's float32 int4 path, 25-60x int8_dot's time, would take seconds a pass at 64 rows
CLEARLY_FASTER = 0.25
MEASUREMENT_VERSION = 5  #: bump when the measured work changes: old answers are stale


SCHEMES = ("int4", "int8")


@dataclass(frozen=True, slots=True)
class QuantizedKernelChoice:
    kernel: str  #: torch or int8_dot (for one scheme at least)
    reason: str  #: one line: why (printed by `specexec run`)
    int4_rows: int = 0  #: int4 layers' calls of up to this many rows take int8_dot (0: none)
    int8_rows: int = 0  #: the same for int8 layers

    def rows(self, scheme: str) -> int:
        return self.int4_rows if scheme == "int4" else self.int8_rows


def check_quantized_kernel(value) -> None:
    if value not in QUANTIZED_KERNELS:
        raise ValueError(
            f"config key 'quantized_kernel': got {value!r}; allowed: {', '.join(QUANTIZED_KERNELS)}"
        )


def pack_q4(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """4-bit codes [out, in] (0..15) with a scale and an offset per block of 32 inputs ([out, in / 32]
    each) -> the kernel's tiles, [out / 8, in / 32 * 160] uint8. Per tile of 8 weight rows and block of
    32 inputs: four 32-byte vectors, vector v's byte 4i + j holding row i's input 4v + j in its low nibble
    and input 16 + 4v + j in its high one, then the 8 rows' scales, then their offsets, in float16 (GGUF's
    Q4_1 holds them so: exact there; specexec's int4 rounds them to float16)."""
    out_features, in_features = q.shape
    tiles, blocks = out_features // TILE, in_features // BLOCK
    chunks = q.to(torch.uint8).reshape(tiles, TILE, blocks, 8, 4)  # [tile, row, block, chunk, byte]
    nibbles = chunks[:, :, :, :4] | (chunks[:, :, :, 4:] << 4)  # [tile, row, block, vector, byte]
    codes = nibbles.permute(0, 2, 3, 1, 4).reshape(tiles, blocks, 128)
    halves = [_per_tile_block(values.to(torch.float16)).view(torch.uint8) for values in (scale, offset)]
    return torch.cat([codes, *halves], dim=2).reshape(tiles, -1).contiguous()  # 16 bytes each a tile's block


def _nibble_vectors(tiles: torch.Tensor) -> torch.Tensor:
    """The low 4 bits of each block's eight `pack_q8` vectors, [tiles, blocks, 8, 32] uint8, from tiles of
    160-byte blocks whose first 128 bytes hold vectors 0..3 in their low nibbles and 4..7 in their high
    ones (`pack_q4`'s codes, `pack_q5`'s low bits)."""
    blocks = tiles.shape[1] // 160
    nibbles = tiles.reshape(tiles.shape[0], blocks, 160)[:, :, :128].reshape(tiles.shape[0], blocks, 4, 32)
    return torch.cat([nibbles & 0x0F, nibbles >> 4], dim=2)


def unpack_q4_codes(tiles: torch.Tensor) -> torch.Tensor:
    """`pack_q4`'s tiles back to the 4-bit codes [out, in] uint8 (the scales and offsets left out)."""
    return unpack_q8(_nibble_vectors(tiles).flatten(1))


def unpack_q4_scales(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`pack_q4`'s tiles' scales and offsets back, [out, in / 32] float32 each (their float16 values)."""
    count = tiles.shape[1] // 160
    halves = tiles.reshape(tiles.shape[0], count, 160)[:, :, 128:].contiguous().view(torch.float16)
    per_row = halves.reshape(tiles.shape[0], count, 2, TILE).permute(2, 0, 3, 1)  # [which, tile, row, block]
    scale, offset = per_row.reshape(2, tiles.shape[0] * TILE, count).float()
    return scale, offset


def pack_q8(weight: torch.Tensor) -> torch.Tensor:
    """int8 codes [out, in] -> the kernel's tiles, [out / 8, in / 32 * 256] int8: per tile of 8 weight rows
    and block of 32 inputs, eight 32-byte vectors, vector c's byte 4i + j holding row i's input 4c + j."""
    out_features, in_features = weight.shape
    chunks = weight.reshape(out_features // TILE, TILE, in_features // BLOCK, 8, 4)
    return chunks.permute(0, 2, 3, 1, 4).reshape(out_features // TILE, -1).contiguous()


def unpack_q8(tiles: torch.Tensor) -> torch.Tensor:
    """`pack_q8`'s tiles back to the codes [out, in]."""
    blocks = tiles.shape[1] // (8 * TILE * 4)
    chunks = tiles.reshape(tiles.shape[0], blocks, 8, TILE, 4)  # [tile, block, chunk, row, byte]
    return chunks.permute(0, 3, 1, 2, 4).reshape(tiles.shape[0] * TILE, blocks * 32)


#: what a layer's 5-bit values less this are without offsets (Q5_0's -16..15); with offsets, the values
Q5_CENTRE = 16


def holds_five_bits(codes: torch.Tensor, with_offset: bool) -> bool:
    """Whether `pack_q5` holds int8 codes [out, in]: -16..15 for a layer without offsets (GGUF's Q5_0),
    0..31 for one with them (Q5_1, Q5_K, and 4-bit types fused with them)."""
    low = 0 if with_offset else -Q5_CENTRE
    return bool(codes.numel()) and int(codes.min()) >= low and int(codes.max()) <= low + 31


def pack_q5(codes: torch.Tensor, with_offset: bool) -> torch.Tensor:
    """int8 codes [out, in] (`holds_five_bits`) -> 5-bit tiles, [out / 8, in / 32 * 160] uint8: per tile of 8
    weight rows and block of 32 inputs, `pack_q8`'s eight vectors at 5 bits a code (`tile_layout.h`): four
    32-byte vectors whose low nibbles hold the low 4 bits of vectors 0..3 and high nibbles those of 4..7,
    then 8 little-endian 32-bit words, word c's bit p holding bit 4 of vector c's byte p."""
    values = (codes.to(torch.int16) + (0 if with_offset else Q5_CENTRE)).to(torch.uint8)
    vectors = pack_q8(values).reshape(codes.shape[0] // TILE, -1, 8, 32)  # [tile, block, vector, byte]
    low = vectors & 0x0F
    nibbles = (low[:, :, :4] | (low[:, :, 4:] << 4)).flatten(2)  # [tile, block, 128]
    high = (vectors >> 4).reshape(*vectors.shape[:3], 4, 8)  # [tile, block, vector, word byte, bit]
    weights = torch.tensor([1 << bit for bit in range(8)], dtype=torch.uint8)
    words = (high * weights).sum(-1, dtype=torch.uint8).flatten(2)  # [tile, block, 32]
    return torch.cat([nibbles, words], dim=2).reshape(codes.shape[0] // TILE, -1).contiguous()


def unpack_q5(tiles: torch.Tensor, with_offset: bool) -> torch.Tensor:
    """`pack_q5`'s tiles back to the int8 codes [out, in]."""
    low = _nibble_vectors(tiles)  # [tile, block, vector, byte]
    words = tiles.reshape(*low.shape[:2], 160)[:, :, 128:].reshape(*low.shape[:2], 8, 4, 1)
    high = ((words >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(low.shape)
    values = (low | (high << 4)).flatten(1)  # [tile, blocks * 256]: `pack_q8`'s tiles of the values
    return unpack_q8(values).to(torch.int16).sub(0 if with_offset else Q5_CENTRE).to(torch.int8)


def tile_block_scales(scale: torch.Tensor) -> torch.Tensor:
    """One float32 scale per block of 32 inputs, [out, in / 32] -> [out / 8, in / 32 * 8] as `pack_q8`
    tiles the codes (a tile's block: its 8 rows' scales); the same for one per 16 inputs, [out, in / 16]
    -> [out / 8, in / 16 * 8] (a tile's block: its first half's 8 scales, then its second half's)."""
    return _per_tile_block(scale.float()).reshape(scale.shape[0] // TILE, -1)


def _per_tile_block(values: torch.Tensor) -> torch.Tensor:
    """One value per weight row and block, [out, in / 32] -> [out / 8, in / 32, 8]: a tile's block's 8
    rows' values together, as the kernels read a tile's scales (`pack_q4`, `tile_block_scales`)."""
    out_features, blocks = values.shape
    return values.reshape(out_features // TILE, TILE, blocks).transpose(1, 2).contiguous()


def untile_block_scales(tiled: torch.Tensor) -> torch.Tensor:
    """`tile_block_scales` undone: [out, in / 32]."""
    return tiled.reshape(tiled.shape[0], -1, TILE).transpose(1, 2).reshape(tiled.shape[0] * TILE, -1)


def q4_linear(x, tiles) -> torch.Tensor:
    """x [M, in] @ (q * scale + offset)^T with int8 activations (``tiles``: `pack_q4`): [M, out] in x's
    dtype."""
    return cpu_kernels().q4_linear(x, tiles)


def q8_linear(x, tiles, scale, offset=None) -> torch.Tensor:
    """x [M, in] @ (weight * scale + offset)^T with int8 activations (``tiles``: `pack_q8`; ``scale``: one
    per row [out], or one per block of 32 or 16 inputs tiled by `tile_block_scales`, in float32 (or
    float16, one per block of 32: widened exactly in the kernel); ``offset``: none, or
    one per block of 32 tiled the same way, with block scales): [M, out] in x's dtype."""
    return cpu_kernels().q8_linear(x, tiles, scale, offset)


def q8_dequantize(tiles, scale, offset, dtype: torch.dtype) -> torch.Tensor:
    """`q8_linear`'s block-scaled tiles (scales per 32 or 16 inputs, offsets per 32 or None) as dense
    weights [out, in] in ``dtype`` (float32, bfloat16 or float16): codes * scale + offset in float, rounded
    once to dtype, as the same torch ops give them."""
    return cpu_kernels().q8_dequantize(tiles, scale, offset, dtype)


def int8_dot_loads() -> bool:
    """Whether the int8_dot kernels can run here: the C++ CPU kernels built and loaded."""
    return cpu_kernels() is not None


def kernel_isa() -> str:
    """The integer dot product the built kernels run: avx512_vnni, avx_vnni, avx2 or scalar."""
    return cpu_kernels().quantized_dot_isa()


def quantized_layers(module: nn.Module) -> list[nn.Module]:
    """The weight-only quantized layers (`quantized_linear.WeightOnlyLinear`) the int8_dot kernels can
    take, in module order."""
    return [
        m for m in module.modules() if callable(getattr(m, "takes_int8_dot", None)) and m.takes_int8_dot()
    ]


def set_int8_dot(modules, choice: QuantizedKernelChoice | None) -> int:
    """Route each quantized layer of ``modules`` to int8_dot for the rows ``choice`` gives its scheme
    (None or 0 rows: none, and the layer drops the kernel's copies); returns how many layers take it."""
    count = 0
    for module in modules:
        for layer in quantized_layers(module):
            rows = 0 if choice is None else choice.rows(layer.scheme)
            layer.set_int8_dot_rows(rows)
            count += rows > 0
    return count


def choose_quantized_kernel(setting: str, model: nn.Module, cache_dir: Path | None) -> QuantizedKernelChoice:
    """The kernel for ``model``'s quantized layers (see the module docstring)."""
    check_quantized_kernel(setting)
    choice = _choose(setting, model, cache_dir)
    blocks = sum(getattr(m, "scheme", None) == "q8_0" for m in model.modules())
    if blocks:  # a GGUF's Q8_0, Q5_0, Q6_K, Q5_1, Q5_K layers, built only where int8_dot runs: on it whatever the choice
        layers = f"{blocks} int8-block layer{'s' if blocks > 1 else ''} (GGUF Q8_0, Q5_0, Q6_K, Q5_1, Q5_K)"
        note = f"; {layers} on int8_dot (torch has no kernel for them)"
        choice = replace(choice, reason=choice.reason + note)
    return choice


def _choose(setting: str, model: nn.Module, cache_dir: Path | None) -> QuantizedKernelChoice:
    if setting == "torch":
        return QuantizedKernelChoice("torch", "configured")
    layers = quantized_layers(model)
    if not layers:  # (a drafter's dense head, too)
        return QuantizedKernelChoice("torch", f"{setting}: no quantized layer the int8_dot kernels take")
    param = next(model.parameters())
    dtype = param.dtype
    runs = fused_ops_take(param)  # the C++ ops loaded, and this device and dtype theirs
    if setting == "int8_dot":
        if not runs:
            raise ValueError(
                "config key 'quantized_kernel': int8_dot runs on a CPU, in float32, bfloat16 or float16, "
                f"where specexec's C++ kernels load; this model is {str(dtype).removeprefix('torch.')} on "
                f"{param.device.type}"
            )
        return QuantizedKernelChoice("int8_dot", f"configured ({kernel_isa()})", MAX_ROWS, MAX_ROWS)
    if not runs:
        return QuantizedKernelChoice("torch", "auto: int8_dot runs on a CPU where the C++ kernels load")
    by_scheme = {s: [m for m in layers if m.scheme == s] for s in SCHEMES}
    ratios = {s: _cached_ratios(group, dtype, cache_dir) for s, group in by_scheme.items() if group}
    return choice_from_ratios(ratios)


def choice_from_ratios(ratios: dict[str, dict[int, float]]) -> QuantizedKernelChoice:
    """Per scheme, int8_dot up to the last measured row count where it and every smaller count took
    under `MARGIN` of torch's time; past the largest count measured (every one faster) up to
    `MAX_ROWS`."""
    rows, parts = {}, []
    for scheme, by_rows in ratios.items():
        rows[scheme] = 0
        counts = sorted(by_rows)
        for count in counts:
            if by_rows[count] >= MARGIN:
                break
            rows[scheme] = MAX_ROWS if count == counts[-1] else count
        measured = ", ".join(f"{n}: {by_rows[n]:.2f}x" for n in sorted(by_rows))
        verdict = (
            "int8_dot for every call"
            if rows[scheme] == MAX_ROWS
            else f"int8_dot up to {rows[scheme]} rows"
            if rows[scheme]
            else "torch"
        )
        parts.append(f"{scheme} {verdict} (int8_dot's time over torch's by rows {measured})")
    why = f"{'; '.join(parts)} on {describe_cpu()}"
    if not any(rows.values()):
        return QuantizedKernelChoice("torch", f"auto: {why}")
    return QuantizedKernelChoice(
        "int8_dot", f"auto ({kernel_isa()}): {why}", rows.get("int4", 0), rows.get("int8", 0)
    )


@torch.inference_mode()
def measure_ratios(layers: list[nn.Module], dtype: torch.dtype, repeats: int = 5) -> dict[int, float]:
    """int8_dot's time over torch's for one pass over ``layers`` at each of `MEASURED_ROWS` rows, taking
    turns, after an untimed warm-up pass each; counts beyond one where int8_dot took `CLEARLY_SLOWER` x
    torch's time are not timed, nor is any count once a first timed pass finds int8_dot under
    `CLEARLY_FASTER` x torch's time (that ratio kept)."""
    for layer in layers:
        layer.set_int8_dot_rows(MAX_ROWS)  # builds the kernel's copies for the timing
    generator = torch.Generator().manual_seed(0)
    ratios = {}
    for rows in MEASURED_ROWS:
        inputs = {
            n: torch.randn(rows, n, generator=generator).to(dtype) for n in {m.in_features for m in layers}
        }
        works = {
            "torch": lambda inputs=inputs: [m.without_int8_dot(inputs[m.in_features]) for m in layers],
            "int8_dot": lambda inputs=inputs: [m._int8_dot(inputs[m.in_features]) for m in layers],
        }
        for work in works.values():
            work()  # warm-up: one-time work (torch's scale tables per dtype) stays out of the timing
        first = {}
        for name, work in works.items():  # one timed pass each decides the clear cases
            started = time.perf_counter()
            work()
            first[name] = time.perf_counter() - started
        if first["int8_dot"] < CLEARLY_FASTER * first["torch"]:
            ratios[rows] = first["int8_dot"] / first["torch"]
            break
        median = interleaved_medians(works, repeats)
        ratios[rows] = median["int8_dot"] / median["torch"]
        if ratios[rows] >= CLEARLY_SLOWER:
            break
    return ratios


def _cached_ratios(layers: list[nn.Module], dtype: torch.dtype, cache_dir: Path | None) -> dict[int, float]:
    shapes = sorted({(m.scheme, m.in_features, m.out_features) for m in layers})
    key = f"v{MEASUREMENT_VERSION}|{machine_key()}|{dtype}|layers={len(layers)}|{shapes}"
    return cached_row_ratios(
        cache_dir,
        "quantized-kernel",
        key,
        lambda: measure_ratios(layers, dtype),
        "quantized_kernel auto: timing the int8_dot kernels against torch's on this CPU",
    )
