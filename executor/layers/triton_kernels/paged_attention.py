"""Decode and verify rows attending straight over the paged KV pool on CUDA, in two Triton launches:

1. `_split_kernel`: one program per (query row, head, split of the keys) reads its keys' K and V from
   the pool through the block table, `TILE` keys at a time (no gather into a padded copy), and writes
   the split's running max, its sum of exponentials and its weighted sum of values;
2. `_merge_kernel`: one program per (query row, head) merges its splits by log-sum-exp.

The splits spread the keys of a long context over the GPU (flash-decoding); their number and length
depend only on the block table's width, so a captured graph holds them. A query at position p sees the keys k of its
request with k <= p, k < kv_len and, with a sliding window, k > p - window (the C++ CPU kernel's rule,
`paged_attention_cpu.cpp`); scores ``scale * q . k``, soft-capped as ``cap * tanh(s / cap)`` where
asked. A row that sees no key (padding) gets zeros. Scores and sums are float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE = 64  #: keys a program of the first launch reads at a time
MAX_SPLITS = 32  #: programs a (query row, head) splits its keys over, at most


@triton.jit
def _split_kernel(
    q_ptr, kv_ptr, tables_ptr, pos_ptr, lens_ptr, max_ptr, sum_ptr, acc_ptr,
    num_queries, num_heads, rep, num_splits, tiles_per_split, block_size, window, scale, softcap,
    q_stride_g, q_stride_t, q_stride_h, kv_stride_side, kv_stride_slot, kv_stride_head,
    tables_stride, pos_stride_g, pos_stride_t,
    HAS_SOFTCAP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)  # (request, query, head), head fastest
    split = tl.program_id(1)
    head = row % num_heads
    t = (row // num_heads) % num_queries
    g = row // (num_heads * num_queries)
    pos = tl.load(pos_ptr + g * pos_stride_g + t * pos_stride_t).to(tl.int64)
    kv_len = tl.load(lens_ptr + g).to(tl.int64)
    hi = tl.minimum(pos, kv_len - 1)
    lo = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q = tl.load(q_ptr + g * q_stride_g + t * q_stride_t + head * q_stride_h + d, mask=d_mask, other=0.0)
    q = q.to(tl.float32)
    head_at = kv_ptr + (head // rep) * kv_stride_head + d[None, :]
    m = tl.max(tl.full([TILE], float("-inf"), tl.float32), axis=0)  # running max
    total = tl.sum(tl.zeros([TILE], tl.float32), axis=0)  # running sum of exp(s - m)
    acc = tl.zeros([BLOCK_D], tl.float32)  # running sum of exp(s - m) * v
    for i in range(tiles_per_split):
        keys = (split * tiles_per_split + i) * TILE + tl.arange(0, TILE).to(tl.int64)
        valid = (keys >= lo) & (keys <= hi)
        page = tl.load(tables_ptr + g * tables_stride + keys // block_size, mask=valid, other=0)
        at = head_at + (page.to(tl.int64) * block_size + keys % block_size)[:, None] * kv_stride_slot
        tile_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(at, mask=tile_mask, other=0.0).to(tl.float32)  # [TILE, BLOCK_D]
        s = tl.sum(k * q[None, :], axis=1) * scale  # [TILE]
        if HAS_SOFTCAP:  # cap * tanh(s / cap), tanh(u) = 1 - 2 / (exp(2u) + 1)
            s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
        s = tl.where(valid, s, float("-inf"))
        new_max = tl.maximum(m, tl.max(s, axis=0))
        base = tl.where(new_max == float("-inf"), 0.0, new_max)
        p = tl.where(valid, tl.exp(s - base), 0.0)
        v = tl.load(at + kv_stride_side, mask=tile_mask, other=0.0).to(tl.float32)
        alpha = tl.exp(m - base)  # 0 while nothing was seen
        total = total * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = new_max
    out = row.to(tl.int64) * num_splits + split
    tl.store(max_ptr + out, m)
    tl.store(sum_ptr + out, total)
    tl.store(acc_ptr + out * BLOCK_D + d, acc)


@triton.jit
def _merge_kernel(
    max_ptr, sum_ptr, acc_ptr, out_ptr, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_SPLITS)
    c_mask = c < num_splits
    m = tl.load(max_ptr + row * num_splits + c, mask=c_mask, other=float("-inf"))
    total_max = tl.max(m, axis=0)
    seen = m > float("-inf")
    w = tl.where(seen, tl.exp(m - tl.where(total_max == float("-inf"), 0.0, total_max)), 0.0)
    denominator = tl.sum(w * tl.load(sum_ptr + row * num_splits + c, mask=c_mask, other=0.0), axis=0)
    d = tl.arange(0, BLOCK_D)
    acc = tl.load(
        acc_ptr + (row * num_splits + c[:, None]) * BLOCK_D + d[None, :], mask=seen[:, None], other=0.0
    )  # [BLOCK_SPLITS, BLOCK_D]
    o = tl.sum(w[:, None] * acc, axis=0) / tl.where(denominator > 0, denominator, 1.0)
    tl.store(out_ptr + row * HEAD_DIM + d, o.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def attend_paged_triton(
    query: torch.Tensor,  # [group, max_q, heads, head_dim]
    kv: torch.Tensor,  # [2, slots, kv_heads, head_dim] one layer's pool
    block_tables: torch.Tensor,  # [group, max_blocks]
    query_pos: torch.Tensor,  # [group, max_q]
    kv_lens: torch.Tensor,  # [group]
    block_size: int,
    scaling: float,
    sliding_window: int | None,
    softcap: float | None,
    tree_bits: torch.Tensor | None = None,
) -> torch.Tensor:  # [group, max_q, heads, head_dim]
    """Each query over the keys its request holds at or before its position (and inside the sliding
    window), read from the pool in place. Token trees (``tree_bits``) are not attended here: the
    executor refuses ``draft_tree`` on CUDA."""
    if tree_bits is not None:
        raise NotImplementedError("the Triton paged attention kernel has no token-tree mask")
    group, max_q, num_heads, head_dim = query.shape
    if query.stride(-1) != 1 or kv.stride(-1) != 1:
        raise ValueError("attend_paged_triton: the head dimension must be contiguous")
    out = torch.empty(group, max_q, num_heads, head_dim, dtype=query.dtype, device=query.device)
    rows = group * max_q * num_heads
    if rows == 0:
        return out
    tiles = triton.cdiv(block_tables.shape[1] * block_size, TILE)
    num_splits = min(tiles, MAX_SPLITS)
    tiles_per_split = triton.cdiv(tiles, num_splits)
    block_d = triton.next_power_of_2(head_dim)
    f32 = dict(dtype=torch.float32, device=query.device)
    split_max, split_sum = torch.empty(rows, num_splits, **f32), torch.empty(rows, num_splits, **f32)
    split_acc = torch.empty(rows, num_splits, block_d, **f32)
    _split_kernel[(rows, num_splits)](
        query, kv, block_tables, query_pos, kv_lens, split_max, split_sum, split_acc,
        max_q, num_heads, num_heads // kv.shape[2], num_splits, tiles_per_split, block_size,
        sliding_window or 0, scaling, softcap or 0.0,
        query.stride(0), query.stride(1), query.stride(2), kv.stride(0), kv.stride(1), kv.stride(2),
        block_tables.stride(0), query_pos.stride(0), query_pos.stride(1),
        HAS_SOFTCAP=bool(softcap), HEAD_DIM=head_dim, BLOCK_D=block_d, TILE=TILE, num_warps=4,
    )  # fmt: skip
    _merge_kernel[(rows,)](
        split_max, split_sum, split_acc, out, num_splits,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_SPLITS=triton.next_power_of_2(num_splits), num_warps=4,
    )  # fmt: skip
    return out
