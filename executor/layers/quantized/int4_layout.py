"""How torch's int4 kernels lay out 4-bit codes: packing them for the CPU or CUDA kernel, and reading
them back (the CPU layout directly where it is the known one, else through the kernel itself)."""

from __future__ import annotations

import functools

import torch

GROUP_SIZE = 32  #: input features per int4 scale (GGUF's block size; the kernels take 32..256)
#: tinygemm's packing parameter, the largest of these that divides the layer (8 is torchao's default):
#: its packing needs the input features in multiples of 16 x tiles, and SmolLM2's 576 is not one of 128
CUDA_INT4_INNER_K_TILES = (8, 4, 2)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q [out, in] in 0..15 -> the device kernel's packed layout."""
    if q.device.type == "cpu":
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    pairs = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)  # [out, in / 2]
    return torch.ops.aten._convert_weight_to_int4pack(pairs, cuda_inner_k_tiles(q.shape[1]))


def cuda_inner_k_tiles(in_features: int) -> int:
    """The CUDA packing's inner K tiles for a layer of ``in_features`` (a multiple of `GROUP_SIZE`)."""
    return next(t for t in CUDA_INT4_INNER_K_TILES if in_features % (16 * t) == 0)


#: the CPU packing's layout, as read off torch 2.13: rows in blocks of 64; byte j of column k of a block
#: holds row j's code in its low nibble and row 32 + j's in its high one. Checked at run time
#: (`cpu_layout_is_known`): another torch falls back to the slower identity unpacking.
CPU_PACK_ROWS = 64


def unpack_cpu_layout(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    half = CPU_PACK_ROWS // 2
    blocks = packed.reshape(out_features // CPU_PACK_ROWS, in_features, half).transpose(1, 2)  # [b, 32, in]
    codes = torch.empty(out_features // CPU_PACK_ROWS, CPU_PACK_ROWS, in_features, dtype=torch.uint8)
    torch.bitwise_and(blocks, 0x0F, out=codes[:, :half])
    torch.bitwise_right_shift(blocks, 4, out=codes[:, half:])
    return codes.view(out_features, in_features)  # [out, in] uint8


@functools.cache
def cpu_layout_matches() -> bool:
    q = torch.randint(0, 16, (2 * CPU_PACK_ROWS, 2 * GROUP_SIZE), generator=torch.Generator().manual_seed(0))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    return torch.equal(unpack_cpu_layout(packed, *q.shape).long(), q)


def cpu_layout_is_known(out_features: int) -> bool:
    return out_features % CPU_PACK_ROWS == 0 and cpu_layout_matches()


def unpack_int4(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """The codes back, by running the kernel on the identity with scale 1 and zero 8 (exact in bfloat16:
    every output is one code, an integer below 16, times 1.0 plus zeros)."""
    groups = in_features // GROUP_SIZE
    table = torch.zeros(groups, out_features, 2, dtype=torch.bfloat16, device=packed.device)
    table[..., 0], table[..., 1] = 1.0, 8.0
    eye = torch.eye(in_features, dtype=torch.bfloat16, device=packed.device)
    if packed.device.type == "cpu":
        codes = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, packed, GROUP_SIZE, table)
    else:
        codes = torch.ops.aten._weight_int4pack_mm(eye, packed, GROUP_SIZE, table)
    return codes.t().round().to(torch.uint8)  # [out, in]
