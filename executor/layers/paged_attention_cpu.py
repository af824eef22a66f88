"""Decode and verify rows attending straight over the paged KV pool on the CPU: the C++ op
``paged_attention_short`` (`paged_attention_cpu.cpp`, built by `cpu_kernels`): no page gather, no
float32 copy of bfloat16 keys, one task per (request, chunk of 128 keys) on torch's threads, its KV
heads together."""

from __future__ import annotations

import torch

from .cpu_kernels import cpu_kernels


def paged_cpu_kernel_runs(q: torch.Tensor) -> bool:
    """Whether the C++ kernel can take this query: on the CPU, once the ops have loaded."""
    return q.device.type == "cpu" and cpu_kernels() is not None


def attend_paged_cpu(
    query: torch.Tensor,  # [group, max_q, heads, head_dim]
    kv: torch.Tensor,  # [2, slots, kv_heads, head_dim] one layer's pool
    block_tables: torch.Tensor,  # [group, max_blocks]
    query_pos: torch.Tensor,  # [group, max_q]
    kv_lens: torch.Tensor,  # [group]
    block_size: int,
    scaling: float,
    sliding_window: int | None,
    softcap: float | None,
    tree_bits: torch.Tensor | None = None,  # [group, max_q] a step verifying token trees
) -> torch.Tensor:  # [group, max_q, heads, head_dim]
    """Each query over the keys its request holds at or before its position (and inside the sliding
    window), read from the pool in place; the C++ ops must have loaded (`cpu_kernels`). With
    ``tree_bits`` a query sees of its request's new keys only those whose bit is set (its ancestors in
    a token tree, `sampling/tree_shape.row_ancestor_bits`)."""
    ops = cpu_kernels()
    if ops is None:
        raise RuntimeError("specexec's C++ CPU kernels are not available")
    return ops.paged_attention_short(
        query,
        kv,
        block_tables,
        query_pos,
        kv_lens,
        block_size,
        scaling,
        sliding_window or 0,
        softcap or 0.0,
        tree_bits,
    )
