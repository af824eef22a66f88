"""A GGUF file's quantized tensors, decoded from their blocks, matched to a transformers model's modules.

Block layouts (ggml's `ggml-common.h`; 32 weights per block, along the input features):
- Q4_0: d (fp16), 16 bytes of codes         -> weight = d * (q - 8)
- Q4_1: d, m (fp16), 16 bytes of codes      -> weight = d * q + m
A 4-bit block's byte j holds code j in its low nibble and code j + 16 in its high one.

transformers converts a GGUF by dequantizing every tensor (and, for llama-like models, reordering the
rows of attn_q / attn_k back to Hugging Face's rotary layout). `match_rows` finds that reordering by
comparing each dequantized row with the converted model's row, so the codes land on the right outputs
whatever the architecture's convention, and a tensor that does not match is refused, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .quantized_linear import Int4Weights, QuantizationError

BLOCK = 32
INT4_TYPES = ("Q4_0", "Q4_1")  #: the types that map exactly onto the int4 kernels' layout
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


@dataclass(slots=True)
class GGUFTensor:
    name: str  #: GGUF name, e.g. blk.0.attn_q.weight
    type_name: str  #: Q4_1, Q8_0, F32, ...
    shape: tuple[int, int]  #: [rows, cols] as torch orders it (GGUF lists the columns first)
    blocks: np.ndarray  # [rows, bytes per row] uint8 for quantized types (a view into the mapped file)

    def decode(self) -> Int4Weights:
        """The codes and scales, as stored (no rounding anywhere)."""
        if self.type_name not in INT4_TYPES:
            raise QuantizationError(f"{self.name}: {self.type_name} has no exact kernel layout here")
        rows, cols = self.shape
        raw = np.ascontiguousarray(self.blocks).reshape(rows, cols // BLOCK, _BLOCK_BYTES[self.type_name])
        d = _fp16(raw[..., 0:2])  # [rows, blocks]
        packed = raw[..., 4:] if self.type_name == "Q4_1" else raw[..., 2:]  # [rows, blocks, 16]
        codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)  # [rows, blocks, 32]
        q = torch.from_numpy(codes.reshape(rows, cols).astype(np.uint8))
        offset = _fp16(raw[..., 2:4]) if self.type_name == "Q4_1" else -8 * d
        return Int4Weights(q, d, offset, BLOCK)

    def decode_q8_0(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A Q8_0 tensor's int8 codes [rows, cols] and float32 block scales [rows, cols / 32], as stored."""
        if self.type_name != "Q8_0":
            raise QuantizationError(f"{self.name}: {self.type_name} is not Q8_0")
        rows, cols = self.shape
        raw = np.ascontiguousarray(self.blocks).reshape(rows, cols // BLOCK, _BLOCK_BYTES["Q8_0"])
        q = torch.from_numpy(np.ascontiguousarray(raw[..., 2:]).view(np.int8).reshape(rows, cols).copy())
        return q, _fp16(raw[..., 0:2])


def _fp16(two_bytes: np.ndarray) -> torch.Tensor:  # [..., 2] uint8 -> [...] float32 (exact)
    return torch.from_numpy(np.ascontiguousarray(two_bytes).view(np.float16)[..., 0].astype(np.float32))


class GGUFFile:
    """The tensors of one GGUF file by name, and the map from transformers module names to them."""

    def __init__(self, path: str | Path) -> None:
        import gguf

        self.path = Path(path)
        reader = gguf.GGUFReader(str(self.path))
        self.tensors = {
            t.name: GGUFTensor(t.name, t.tensor_type.name, tuple(int(n) for n in reversed(t.shape)), t.data)
            for t in reader.tensors
        }
        arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
        arch_id = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
        if arch_id is None:
            raise QuantizationError(f"{self.path}: architecture {arch!r} is unknown to gguf-py")
        num_blocks = 1 + max((int(n.split(".")[1]) for n in self.tensors if n.startswith("blk.")), default=-1)
        self._names = gguf.get_tensor_name_map(arch_id, num_blocks)

    def tensor_for(self, module_name: str) -> GGUFTensor | None:
        """The GGUF weight of a transformers module (e.g. model.layers.0.self_attn.q_proj), if stored."""
        name = self._names.get_name(module_name)
        return None if name is None else self.tensors.get(f"{name}.weight")


def match_rows(stored: torch.Tensor, converted: torch.Tensor, name: str) -> torch.Tensor:
    """``order`` [rows] with ``stored[order] == converted`` exactly (both [rows, cols], compared in the
    converted dtype); refuse if any converted row is not among the stored ones.

    Rows are matched by their bits, with -0.0 made +0.0 on both sides first: a Q4_0 block with a
    negative scale decodes a code of 8 to ``d * (8 - 8)``, -0.0 in gguf-py's dequantization (and so in
    transformers' converted copy) and +0.0 in ours; llama-quantize writes such scales wherever a block's
    largest-magnitude value is positive, so every Q4_0 file it made was refused."""
    converted = converted.detach().cpu() + 0.0  # (-0.0 + 0.0 is +0.0; every other value is kept)
    stored = stored.to(converted.dtype) + 0.0
    if torch.equal(stored, converted):
        return torch.arange(stored.shape[0])
    index = {row.tobytes(): i for i, row in enumerate(_bits(stored))}
    order = []
    for row in _bits(converted):
        i = index.get(row.tobytes())
        if i is None:
            raise QuantizationError(
                f"{name}: the converted weights are not a reordering of the GGUF tensor's rows; "
                "the file and the converted copy disagree"
            )
        order.append(i)
    return torch.tensor(order)


def _bits(t: torch.Tensor) -> np.ndarray:  # [rows, cols] as integers of the same width (numpy has no bf16)
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(width).numpy()
