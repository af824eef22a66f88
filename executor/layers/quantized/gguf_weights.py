"""A GGUF file's quantized tensors, decoded from their blocks, matched to a transformers model's modules.

Block layouts (ggml's `ggml-common.h`; 32 weights per block, along the input features):
- Q4_0: d (fp16), 16 bytes of codes          -> weight = d * (q - 8)
- Q4_1: d, m (fp16), 16 bytes of codes       -> weight = d * q + m
- Q5_0: d (fp16), 4 bytes of fifth bits, 16 bytes of codes -> weight = d * (q - 16)
- Q5_1: d, m (fp16), 4 bytes of fifth bits, 16 bytes of codes -> weight = d * q + m
- Q8_0: d (fp16), 32 int8 codes              -> weight = d * q
A 4-bit block's byte j holds code j in its low nibble and code j + 16 in its high one; Q5_0's bit j
of its 32-bit word is code j's fifth bit (Q5_1's too).
- Q4_K: 256 weights a super-block: d, dmin (fp16), 12 bytes packing eight 6-bit scales and eight
  6-bit mins, 128 bytes of codes; sub-block j (32 weights) -> weight = d * scale_j * q - dmin * min_j.
  Its 64-weight chunk c holds sub-block 2c in its 32 bytes' low nibbles and 2c + 1 in the high ones.
- Q5_K: 256 weights a super-block: d, dmin (fp16), Q4_K's 12 bytes of scales and mins, 32 bytes of fifth
  bits, 128 bytes of codes laid out as Q4_K's; sub-block j's fifth bits are bit j of the 32 bytes ->
  weight = d * scale_j * q - dmin * min_j, q in 0..31.
- Q6_K: 256 weights a super-block: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8
  scales, d (fp16); sub-block j (16 weights) -> weight = d * scale_j * (q - 32). Its 128-weight half h
  holds four runs of 32: low nibbles of bytes 0-31 and 32-63 of its 64, then their high nibbles, each
  with its 2 high bits from the half's 32 high-bit bytes at shifts 0, 2, 4, 6.

Which kernel layout holds each type (`quantization._install_gguf`):
- Q4_0, Q4_1 and Q4_K: int4 codes with a scale and an offset per 32 weights (`Int4Weights`), exact in
  float32 (Q4_K's scale d * scale_j and offset -dmin * min_j are exact float32 products). The kernels'
  tiles hold the scales and offsets in float16, which Q4_0 and Q4_1 store; Q4_K's are rounded to float16
  there (relative error at most 2^-11 each: `Q4_K_TILE_ERROR`).
- Q8_0, Q5_0 and Q6_K: int8 codes with one float32 scale per 32 weights (Q5_0's codes q - 16), per 16
  for Q6_K (codes q - 32, scale d * scale_j: an exact float32 product), exact.
- Q5_1 and Q5_K: int8 codes 0..31 with a float32 scale and offset per 32 weights (Q5_K's d * scale_j and
  -dmin * min_j, exact float32 products), exact: weight = q * scale + offset, rounded as gguf-py rounds it.
Other types (Q2_K, Q3_K, IQ*, ...) are dequantized to dense weights, as transformers converts them.

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

from .gguf_index import GGUFFormatError, read_gguf_index
from .quantized_linear import Int4Weights, QuantizationError

BLOCK = 32
SUPER_BLOCK = 256  #: the K types' weights per super-block
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")  #: the types whose codes the int4 layout holds
#: the types whose codes the int8-block layout holds (the last two with an offset per block)
INT8_BLOCK_TYPES = ("Q8_0", "Q5_0", "Q6_K", "Q5_1", "Q5_K")
#: bytes per block (per super-block for the K types)
_BLOCK_BYTES = {
    "Q4_0": 18,
    "Q4_1": 20,
    "Q5_0": 22,
    "Q5_1": 24,
    "Q8_0": 34,
    "Q4_K": 144,
    "Q5_K": 176,
    "Q6_K": 210,
}
Q4_K_TILE_ERROR = 2.0**-11  #: a Q4_K scale or offset's relative error once rounded to float16 (normal range)


@dataclass(slots=True)
class GGUFTensor:
    name: str  #: GGUF name, e.g. blk.0.attn_q.weight
    type_name: str  #: Q4_1, Q8_0, F32, ...
    shape: tuple[int, int]  #: [rows, cols] as torch orders it (GGUF lists the columns first)
    blocks: np.ndarray  # [rows, bytes per row] uint8 for quantized types (a view into the mapped file)

    def decode(self) -> Int4Weights:
        """The 4-bit codes, with a float32 scale and offset per 32 weights, as stored (no rounding)."""
        if self.type_name not in INT4_TYPES:
            raise QuantizationError(f"{self.name}: {self.type_name} has no int4 kernel layout here")
        if self.type_name == "Q4_K":
            return self._decode_q4_k()
        rows, cols = self.shape
        raw = self._blocks(BLOCK)  # [rows, blocks, bytes]
        d = _fp16(raw[..., 0:2])  # [rows, blocks]
        packed = raw[..., 4:] if self.type_name == "Q4_1" else raw[..., 2:]  # [rows, blocks, 16]
        codes = _nibbles(packed, axis=-1)  # [rows, blocks, 32]
        q = torch.from_numpy(codes.reshape(rows, cols).astype(np.uint8))
        offset = _fp16(raw[..., 2:4]) if self.type_name == "Q4_1" else -8 * d
        return Int4Weights(q, d, offset, BLOCK)

    def _decode_q4_k(self) -> Int4Weights:
        rows, cols = self.shape
        raw = self._blocks(SUPER_BLOCK)  # [rows, supers, 144]
        d, dmin = _fp16(raw[..., 0:2]), _fp16(raw[..., 2:4])  # [rows, supers]
        sc, mins = _k_scales_and_mins(raw[..., 4:16])  # [rows, supers, 8] each
        packed = raw[..., 16:].reshape(rows, -1, 4, 1, 32)  # [rows, supers, chunk, 1, byte]
        codes = _nibbles(packed, axis=3)  # [rows, supers, chunk, half, 32]
        q = torch.from_numpy(codes.reshape(rows, cols).astype(np.uint8))
        scale = (d[..., None] * torch.from_numpy(sc.astype(np.float32))).reshape(rows, -1)  # [rows, blocks]
        offset = -(dmin[..., None] * torch.from_numpy(mins.astype(np.float32))).reshape(rows, -1)
        return Int4Weights(q, scale, offset, BLOCK)

    def decode_int8_blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """A Q8_0, Q5_0, Q6_K, Q5_1 or Q5_K tensor's int8 codes [rows, cols], float32 scales [rows, cols / 32]
        ([rows, cols / 16] for Q6_K) and offsets [rows, cols / 32] (None but for Q5_1 and Q5_K), as stored
        (codes centred where the type has no offset: Q5_0's q - 16, Q6_K's q - 32)."""
        if self.type_name not in INT8_BLOCK_TYPES:
            raise QuantizationError(f"{self.name}: {self.type_name} has no int8-block kernel layout here")
        if self.type_name == "Q6_K":
            return (*self._decode_q6_k(), None)
        if self.type_name == "Q5_K":
            return self._decode_q5_k()
        rows, cols = self.shape
        raw = self._blocks(BLOCK)  # [rows, blocks, bytes]
        if self.type_name == "Q8_0":
            q = np.ascontiguousarray(raw[..., 2:]).view(np.int8)
            return torch.from_numpy(q.reshape(rows, cols).copy()), _fp16(raw[..., 0:2]), None
        has_offset = self.type_name == "Q5_1"
        bits = raw[..., 4:] if has_offset else raw[..., 2:]  # [rows, blocks, 4 + 16]: fifth bits, codes
        high = np.ascontiguousarray(bits[..., 0:4]).view("<u4")  # [rows, blocks, 1]
        high = (high >> np.arange(32, dtype=np.uint32)) & 1  # [rows, blocks, 32]
        q = _nibbles(bits[..., 4:], axis=-1) | (high.astype(np.uint8) << 4)  # [rows, blocks, 32] in 0..31
        q = torch.from_numpy(q.reshape(rows, cols).astype(np.int8))
        if has_offset:
            return q, _fp16(raw[..., 0:2]), _fp16(raw[..., 2:4])
        return q - 16, _fp16(raw[..., 0:2]), None

    def _decode_q5_k(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows, cols = self.shape
        raw = self._blocks(SUPER_BLOCK)  # [rows, supers, 176]
        supers = raw.shape[1]
        d, dmin = _fp16(raw[..., 0:2]), _fp16(raw[..., 2:4])  # [rows, supers]
        sc, mins = _k_scales_and_mins(raw[..., 4:16])  # [rows, supers, 8] each
        high = raw[..., 16:48].reshape(rows, supers, 1, 32) >> np.arange(8, dtype=np.uint8)[:, None]
        # [rows, supers, chunk, half, 32]: chunk c's low nibbles are sub-block 2c, its high ones 2c + 1
        low = _nibbles(raw[..., 48:].reshape(rows, supers, 4, 1, 32), axis=3)
        q = low.reshape(rows, supers, 8, 32) | ((high & 1) << 4)  # [rows, supers, sub-block, 32] in 0..31
        scale = (d[..., None] * torch.from_numpy(sc.astype(np.float32))).reshape(rows, -1)  # [rows, blocks]
        offset = -(dmin[..., None] * torch.from_numpy(mins.astype(np.float32))).reshape(rows, -1)
        return torch.from_numpy(q.reshape(rows, cols).astype(np.int8)), scale, offset

    def _decode_q6_k(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows, cols = self.shape
        raw = self._blocks(SUPER_BLOCK)  # [rows, supers, 210]
        supers = raw.shape[1]
        low = raw[..., :128].reshape(rows, supers, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8)[:, None]
        low = (low & 0x0F).reshape(rows, supers, 8, 32)  # [rows, supers, run, 32]: half h's runs 4h..4h+3
        high = (
            raw[..., 128:192].reshape(rows, supers, 2, 1, 32)
            >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
        )
        high = (high & 0x03).reshape(rows, supers, 8, 32)
        q = (low | (high << 4)).astype(np.int8) - np.int8(32)  # [rows, supers, run, 32] in -32..31
        sub_scales = torch.from_numpy(
            np.ascontiguousarray(raw[..., 192:208]).view(np.int8).astype(np.float32)
        )
        scale = (_fp16(raw[..., 208:210])[..., None] * sub_scales).reshape(rows, cols // 16)
        return torch.from_numpy(q.reshape(rows, cols).copy()), scale

    def _blocks(self, weights_per_block: int) -> np.ndarray:  # [rows, blocks, bytes per block] uint8
        rows, cols = self.shape
        if cols % weights_per_block:
            raise QuantizationError(f"{self.name}: {cols} columns are not whole {self.type_name} blocks")
        raw = np.ascontiguousarray(self.blocks)
        return raw.reshape(rows, cols // weights_per_block, _BLOCK_BYTES[self.type_name])


def _nibbles(packed: np.ndarray, axis: int) -> np.ndarray:
    """Bytes of 4-bit codes -> the codes: every low nibble, then every high one, along ``axis``."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=axis)


def _k_scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A K type's eight 6-bit scales and eight 6-bit mins from their 12 bytes ([..., 12] -> [..., 8] each):
    bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; bytes 8-11 hold the low 4 bits of
    scales 4-7 and (high nibble) of mins 4-7, whose top 2 bits are the top bits of bytes 0-3 and 4-7."""
    scales, mins, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate([scales & 0x3F, (rest & 0x0F) | ((scales >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([mins & 0x3F, (rest >> 4) | ((mins >> 2) & 0x30)], axis=-1)
    return sc, mn


def _fp16(two_bytes: np.ndarray) -> torch.Tensor:  # [..., 2] uint8 -> [...] float32 (exact)
    return torch.from_numpy(np.ascontiguousarray(two_bytes).view(np.float16)[..., 0].astype(np.float32))


class GGUFFile:
    """The tensors of one GGUF file by name, and the map from transformers module names to them."""

    def __init__(self, path: str | Path) -> None:
        import gguf

        self.path = Path(path)
        try:
            index = read_gguf_index(self.path)
        except GGUFFormatError as exc:
            raise QuantizationError(str(exc)) from exc
        self.tensors = {
            t.name: GGUFTensor(t.name, t.type_name, tuple(reversed(t.dims)), t.data)
            for t in index.tensors.values()
        }
        arch = index.architecture
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
