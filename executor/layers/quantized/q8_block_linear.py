"""GGUF's Q8_0, Q5_0, Q6_K, Q5_1 and Q5_K tensors as stored: int8 codes with one scale per block of 32
inputs (Q6_K: per 16), and for Q5_1 and Q5_K an offset per block of 32, run on the int8_dot kernel (torch
has none for them). Codes that fit 5 bits (the Q5 types') are held at 5 bits (`pack_q5`), the others at 8."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .quantized_dot import (
    BLOCK,
    HALF_BLOCK,
    TILE,
    holds_five_bits,
    int8_dot_loads,
    pack_q5,
    pack_q8,
    q8_dequantize,
    q8_linear,
    tile_block_scales,
    unpack_q5,
    unpack_q8,
    untile_block_scales,
)
from .quantized_linear import (
    CPU_KERNEL_DTYPES,
    DENSE_FROM_ROWS,
    Q8_INT8_DOT,
    Q8_OFFSET_INT8_DOT,
    WeightOnlyLinear,
)


class Int8BlockLinear(WeightOnlyLinear):
    """int8 codes with one scale per block of 32 inputs, as GGUF's Q8_0 stores them: weight = q * scale,
    q any int8 (a file may hold -128, which llama.cpp's quantizer never writes; every int8_dot path takes it);
    or one scale per 16 inputs (GGUF's Q6_K: scale [out, in / 16]); with ``offset`` [out, in / 32], weight =
    q * scale + offset (GGUF's Q5_1 and Q5_K: codes 0..31; a fused layer's other types get offset 0).
    Torch has no kernel for it, so every call below `DENSE_FROM_ROWS` rows runs on the int8_dot kernel
    (`quantized_dot.py`; `quantization.py` builds this layer only where that kernel loads), and the rest
    (prefill chunks, float64) on the dequantized weights, which are exact in float32. Codes of 5 bits
    (-16..15 without offsets, as Q5_0's; 0..31 with them, as Q5_1's and Q5_K's) with a scale per 32 are
    held in 5-bit tiles (`code_bits` 5: 6 bits a weight with float32 scales, 5.5 with the float16 ones
    that hold Q5_0's d exactly, 7 with offsets, against 9 and 10 in int8 tiles), which the kernels
    unpack in registers to the same int8 codes."""

    scheme = "q8_0"

    def __init__(
        self, linear: nn.Linear, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None = None
    ) -> None:
        super().__init__(linear)
        if scale.shape[1] not in (q.shape[1] // BLOCK, q.shape[1] // HALF_BLOCK):
            raise ValueError(
                f"scale {tuple(scale.shape)}: one per 32 or per 16 inputs of codes {tuple(q.shape)}"
            )
        if offset is not None and tuple(offset.shape) != (q.shape[0], q.shape[1] // BLOCK):
            raise ValueError(f"offset {tuple(offset.shape)}: one per 32 inputs of codes {tuple(q.shape)}")
        self.inputs_per_scale = q.shape[1] // scale.shape[1]  #: 32 (Q8_0, Q5_0) or 16 (Q6_K)
        with_offset = offset is not None
        five = self.inputs_per_scale == BLOCK and holds_five_bits(q, with_offset)
        self.code_bits = 5 if five else 8  #: bits a code takes in `tiles`
        # [out / 8, in / 32 * 160] uint8 (`pack_q5`) or [out / 8, in / 32 * 256] int8 (`pack_q8`)
        self.register_buffer("tiles", pack_q5(q, with_offset) if five else pack_q8(q))
        # [out / 8, in / inputs_per_scale * 8]; in float16 where that holds every scale exactly (GGUF's
        # Q8_0 and Q5_0 store d in float16): the kernels widen them in registers, half the bytes
        tiled = tile_block_scales(scale)
        exact_in_half = self.inputs_per_scale == BLOCK and torch.equal(tiled.half().float(), tiled)
        self.register_buffer("tiled_scale", tiled.half() if exact_in_half else tiled)
        # [out / 8, in / 32 * 8], or None
        self.register_buffer("tiled_offset", None if offset is None else tile_block_scales(offset))
        self.int8_dot_rows = DENSE_FROM_ROWS - 1
        self.tied_to_embedding = False  #: a tied LM head: its codes are the token embedding's too

    def takes_int8_dot(self) -> bool:
        return False  # always on it: nothing for `quantized_kernel` to choose

    def _int8_dot(self, flat: torch.Tensor) -> torch.Tensor:  # [M, in] -> [M, out]
        return q8_linear(flat, self.tiles, self.tiled_scale, self.tiled_offset)

    def _int8_dot_call(self):
        if self.tiled_offset is not None:
            return Q8_OFFSET_INT8_DOT, [self.tiles, self.tiled_scale, self.tiled_offset]
        return Q8_INT8_DOT, [self.tiles, self.tiled_scale]

    def _torch_call(self, dtype: torch.dtype):
        return None  # torch has no kernel for it

    def _matmul(self, flat: torch.Tensor) -> torch.Tensor:
        return F.linear(flat, self.dequantized(flat.dtype))

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:  # [out, in]
        if (
            dtype in CPU_KERNEL_DTYPES and int8_dot_loads()
        ):  # a prefill chunk's: one C++ pass (10x torch's ops)
            return q8_dequantize(self.tiles, self.tiled_scale, self.tiled_offset, dtype)
        return self.dequantized_by_torch(dtype)

    def dequantized_by_torch(self, dtype: torch.dtype) -> torch.Tensor:  # [out, in]: float64 too
        scale = untile_block_scales(self.tiled_scale.float()).repeat_interleave(
            self.inputs_per_scale, dim=1
        )  # [out, in]
        # q * scale (+ offset) in float32, rounded as gguf-py's dequantization rounds it (Q8_0's and Q5_0's
        # products are exact: 8 bits times 11)
        weight = self._codes(self.tiles).float() * scale
        if self.tiled_offset is not None:
            weight = weight + untile_block_scales(self.tiled_offset).repeat_interleave(BLOCK, dim=1)
        return weight.to(dtype)

    def weight_rows(self, rows: torch.Tensor) -> torch.Tensor:  # [N] row indices -> [N, in] float32
        """Some rows of the dequantized weights, read from the tiles (an embedding table's lookup: a
        Q8_0 token embedding as codes, `quantized_embedding.py`): the values `dequantized_by_torch` gives
        those rows, without the whole table."""
        tile, lane = rows // TILE, rows % TILE
        # each row's tile unpacked, then the row's lane of it: [N * 8, in] -> [N, in]
        codes = self._codes(self.tiles[tile])[torch.arange(len(rows)) * TILE + lane]
        scale = self.tiled_scale.view(self.tiled_scale.shape[0], -1, TILE)[
            tile, :, lane
        ].float()  # [N, scales]
        weight = codes.float() * scale.repeat_interleave(self.inputs_per_scale, dim=1)
        if self.tiled_offset is not None:
            offset = self.tiled_offset.view(self.tiled_offset.shape[0], -1, TILE)[tile, :, lane]
            weight = weight + offset.repeat_interleave(BLOCK, dim=1)
        return weight

    def codes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """What the constructor takes: the int8 codes [out, in], block scales [out, in / inputs_per_scale]
        and block offsets [out, in / 32] (or None), in float32."""
        offset = None if self.tiled_offset is None else untile_block_scales(self.tiled_offset)
        return self._codes(self.tiles), untile_block_scales(self.tiled_scale.float()), offset

    def _codes(self, tiles: torch.Tensor) -> torch.Tensor:
        """Some of `tiles`' rows [T, ...] as int8 codes [T * 8, in], from 5-bit or int8 tiles."""
        if self.code_bits == 5:
            return unpack_q5(tiles, with_offset=self.tiled_offset is not None)
        return unpack_q8(tiles)
