"""specexec's integer-dot kernels for a CPU model's quantized linear layers (int4, int8, GGUF), against
torch's; which one runs a layer is the kernel plan's ``quantized_kernel`` choice
(`kernel_plan/quantized_kernel.py`).

- ``torch``: torch's weight-only kernels (`quantized_linear.py`): activations stay in the model's dtype,
  exact in float32 against the dequantized weights.
- ``int8_dot``: specexec's C++ kernels (`quantized_dot_cpu.cpp`), llama.cpp's way: each activation row
  quantized to int8 in blocks of 32, integer dot products (AVX512-VNNI / AVX-VNNI ``dpbusd``, else AVX2),
  one float scale per block. It reads the codes as stored (4-bit codes 16 bytes a block of 32, int8
  codes 32), interleaved 8 weight rows to a tile so that one integer dot product serves 8 rows, where
  torch's int4 kernel dequantizes each weight before a float multiply. The one
  extra rounding is the activations' int8 step (a block's dot is off by at most sum(|w|) * scale / 2;
  `tests/layers/test_quantized_dot.py`). Each row is quantized on its own, so a row's output does not depend on
  the other rows of the call (a verify step's rows equal the same tokens decoded one at a time). It
  takes prefill chunks too: from 128 rows torch's route dequantizes a layer's weights for one dense
  matmul, which int8_dot beat at 128 and 512 rows (float32: 2-13x; bfloat16: 1.0-3.4x).
"""

from __future__ import annotations

import torch

from ..cpu_kernels import cpu_kernels

BLOCK = 32  #: inputs per activation scale (and per Q4 scale): the kernels need in_features in multiples
HALF_BLOCK = 16  #: inputs per weight scale of int8 codes with half-block scales (GGUF's Q6_K)
TILE = 8  #: weight rows the kernels' tiles interleave: they need out_features in multiples
#: "every call" (``int8_dot`` configured, or faster at every measured count)
MAX_ROWS = 2**62


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
