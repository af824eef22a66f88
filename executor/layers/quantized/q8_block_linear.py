"""GGUF's Q8_0, Q5_0 and Q6_K tensors as stored: int8 codes with one scale per block of 32 inputs (Q6_K:
per 16), run on the int8_dot kernel (torch has none for them)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .quantized_dot import (
    BLOCK,
    HALF_BLOCK,
    pack_q8,
    q8_linear,
    tile_block_scales,
    unpack_q8,
    untile_block_scales,
)
from .quantized_linear import DENSE_FROM_ROWS, Q8_INT8_DOT, WeightOnlyLinear


class Int8BlockLinear(WeightOnlyLinear):
    """int8 codes with one scale per block of 32 inputs, as GGUF's Q8_0 stores them: weight = q * scale,
    q any int8 (a file may hold -128, which llama.cpp's quantizer never writes; every int8_dot path takes it);
    or one scale per 16 inputs (GGUF's Q6_K: scale [out, in / 16]).
    Torch has no kernel for it, so every call below `DENSE_FROM_ROWS` rows runs on the int8_dot kernel
    (`quantized_dot.py`; `quantization.py` builds this layer only where that kernel loads), and the rest
    (prefill chunks, float64) on the dequantized weights, which are exact in float32."""

    scheme = "q8_0"

    def __init__(self, linear: nn.Linear, q: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__(linear)
        if scale.shape[1] not in (q.shape[1] // BLOCK, q.shape[1] // HALF_BLOCK):
            raise ValueError(
                f"scale {tuple(scale.shape)}: one per 32 or per 16 inputs of codes {tuple(q.shape)}"
            )
        self.inputs_per_scale = q.shape[1] // scale.shape[1]  #: 32 (Q8_0, Q5_0) or 16 (Q6_K)
        self.register_buffer("tiles", pack_q8(q))  # [out / 8, in / 32 * 256] int8: `pack_q8`
        self.register_buffer("tiled_scale", tile_block_scales(scale))  # [out / 8, in / inputs_per_scale * 8]
        self.int8_dot_rows = DENSE_FROM_ROWS - 1

    def takes_int8_dot(self) -> bool:
        return False  # always on it: nothing for `quantized_kernel` to choose

    def _int8_dot(self, flat: torch.Tensor) -> torch.Tensor:  # [M, in] -> [M, out]
        return q8_linear(flat, self.tiles, self.tiled_scale)

    def _int8_dot_call(self):
        return Q8_INT8_DOT, [self.tiles, self.tiled_scale]

    def _torch_call(self, dtype: torch.dtype):
        return None  # torch has no kernel for it

    def _matmul(self, flat: torch.Tensor) -> torch.Tensor:
        return F.linear(flat, self.dequantized(flat.dtype))

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:  # [out, in]
        scale = untile_block_scales(self.tiled_scale).repeat_interleave(
            self.inputs_per_scale, dim=1
        )  # [out, in]
        return (unpack_q8(self.tiles).float() * scale).to(dtype)  # exact in float32: 7 bits times 11

    def codes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What the constructor takes: the int8 codes [out, in] and block scales [out, in / inputs_per_scale]."""
        return unpack_q8(self.tiles), untile_block_scales(self.tiled_scale)
