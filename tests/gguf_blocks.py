"""GGUF tensors of random blocks, written here (no downloads), for the block-type and embedding tests:
`random_tensor` of a type, the `gguf` package's own dequantization of it (`gguf_dequantized`), and a
`FakeFile` that hands such tensors to quantization's install by module name."""

from __future__ import annotations

import gguf
import numpy as np
import torch
from specexec.executor.layers.quantized.gguf_weights import _BLOCK_BYTES, GGUFTensor

#: the byte offsets of each type's float16 fields in a block (random bytes there could be NaN or Inf)
FP16_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}


def random_tensor(type_name: str, rows: int, cols: int, seed: int = 0, scale: float = 0.02) -> GGUFTensor:
    """A tensor of random blocks: every code and packed scale byte random, the float16 fields normal."""
    rng = np.random.default_rng(seed)
    per_block = 256 if type_name.endswith("_K") else 32
    raw = rng.integers(0, 256, (rows, cols // per_block, _BLOCK_BYTES[type_name]), dtype=np.uint8)
    for at in FP16_FIELDS[type_name]:
        values = rng.normal(0, scale, (rows, cols // per_block, 1)).astype(np.float16)
        raw[..., at : at + 2] = values.view(np.uint8)
    return GGUFTensor(f"blk.0.{type_name}.weight", type_name, (rows, cols), raw.reshape(rows, -1))


def gguf_dequantized(tensor: GGUFTensor) -> torch.Tensor:  # [rows, cols] float32: the gguf package's
    kind = getattr(gguf.GGMLQuantizationType, tensor.type_name)
    return torch.from_numpy(gguf.dequantize(tensor.blocks, kind)).reshape(tensor.shape)


class FakeFile:
    """A GGUF file as quantization's install reads it: the tensor for each module name, if any."""

    def __init__(self, tensors: dict[str, GGUFTensor]):
        self.by_module = tensors

    def tensor_for(self, module_name: str):
        return self.by_module.get(module_name)
