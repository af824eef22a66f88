"""Attention over the paged KV cache: `paged_attention`, which specexec's own decoder and the EAGLE-3
head call, and the same behind transformers' attention-function interface (`paged_attention_forward`).

Any model whose attention modules call ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` runs
on our cache once ``register_paged_attention()`` has run and the model's implementation is set to
``PAGED_ATTENTION``. The per-forward ``AttentionMetadata`` arrives as the ``paged_metadata`` keyword;
each layer only indexes with what it holds (no decision on data, no read back from the device).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..layers.attention_kernels import AUTO, PAGED_CPU, PAGED_TRITON, attend
from ..layers.paged_attention_cpu import attend_paged_cpu, paged_cpu_kernel_runs
from ..layers.triton_kernels import triton_ops_take
from .attention_metadata import AttentionGroup, AttentionMetadata

PAGED_ATTENTION = "specexec_paged"


def _attend_group(
    group: AttentionGroup,
    layer: int,
    meta: AttentionMetadata,
    query: torch.Tensor,  # [num_tokens, heads, head_dim]
    out: torch.Tensor | None,  # [num_tokens, heads, head_dim]; None: return the group's output as is
    scaling: float,
    sliding_window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    num, max_q = group.num_queries, group.max_query_len
    if group.query_slice is not None:
        q = query[group.query_slice].view(num, max_q, *query.shape[1:])
    else:
        q = query[group.query_index]  # [group, max_q, heads, head_dim]
    path = group_path(group, meta)
    kernel = in_place_kernel(path, group, q, sliding_window)
    if kernel is not None:
        o = kernel(
            q,
            meta.kv_cache.kv[layer],
            group.block_tables,
            group.query_pos[..., 0],
            group.kv_lens,
            meta.kv_cache.block_size,
            scaling,
            sliding_window,
            softcap,
            group.tree_bits,
        )  # [group, max_q, heads, head_dim], read from the pages in place
    else:
        o = _attend_gathered(group, layer, meta, q, path, scaling, sliding_window, softcap)
    if out is None:
        return o  # [group, max_q, heads, head_dim]: the caller's whole output
    if group.query_slice is not None:
        out[group.query_slice] = o.reshape(num * max_q, *o.shape[2:])
    else:
        out.index_copy_(0, group.out_index, o.reshape(num * max_q, *o.shape[2:])[group.valid_rows])
    return o


def group_path(group: AttentionGroup, meta: AttentionMetadata) -> str:
    """The measured attention path for this group's shape (`AttentionPaths.for_group`)."""
    return meta.paths.for_group(group.max_query_len, group.is_short, group.num_queries, group.max_kv_len)


def in_place_kernel(path: str, group: AttentionGroup, query: torch.Tensor, sliding_window: int | None = None):
    """The kernel that attends this group straight over the pages (same arguments, same output), or
    None where torch ops run over gathered keys: the Triton kernel on CUDA, the C++ one on the CPU.
    A token tree's rows under a sliding window that cuts in go to torch ops: the kernels cut the window
    at each row's cache slot, the mask at its position (`AttentionGroup.window_query_pos`)."""
    cuts_window = sliding_window and group.max_query_pos >= sliding_window
    if group.window_query_pos is not None and cuts_window:
        return None
    if path == PAGED_TRITON and group.is_short and triton_ops_take(query):
        from ..layers.triton_kernels.paged_attention import attend_paged_triton

        return attend_paged_triton
    return attend_paged_cpu if attends_in_place(path, group, query) else None


def attends_in_place(path: str, group: AttentionGroup, query: torch.Tensor) -> bool:
    """Whether the group (on ``path``) attends through the C++ kernel straight over the pages: measured
    so, or unmeasured decode/verify rows where the kernel runs."""
    return path == PAGED_CPU or (path == AUTO and group.is_short and paged_cpu_kernel_runs(query))


def _attend_gathered(group, layer, meta, q, path, scaling, sliding_window, softcap) -> torch.Tensor:
    """Attention on torch ops over the group's keys: a view of the pool for a lone request on
    consecutive pages, else its pages gathered. q [group, max_q, heads, head_dim] -> the same shape."""
    if group.kv_slice is not None:  # a lone request on consecutive pages: a view, no copy
        key, value = meta.kv_cache.view(layer, group.kv_slice)  # [max_kv, kv_heads, head_dim]
        key, value = key.unsqueeze(0), value.unsqueeze(0)  # [1, max_kv, kv_heads, head_dim]
    else:
        # [group, max_kv, kv_heads, head_dim] each: up to the longest request's keys, and a shorter one's
        # slots past its keys as zeros (a NaN there would pass a masked weight: 0 * NaN is NaN)
        stale_rows = group.stale_rows(meta.kv_cache.block_size)
        key, value = meta.kv_cache.gather_pages(
            layer, group.block_tables, meta.gather_buffer, stale_rows, group.max_kv_len
        )
    q, key, value = q.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if softcap is None and group.uses_causal_kernel(sliding_window):  # a fresh prompt: SDPA's causal kernel
        o = F.scaled_dot_product_attention(q, key, value, is_causal=True, scale=scaling, enable_gqa=True)
    else:
        o = attend(q, key, value, group.mask(sliding_window), scaling, softcap, path)
    return o.transpose(1, 2)  # [group, max_q, heads, head_dim]


def paged_attention(
    layer: int,
    query: torch.Tensor,  # [num_tokens, heads, head_dim]
    key: torch.Tensor | None,  # [num_tokens, kv_heads, head_dim] (None: written already)
    value: torch.Tensor | None,  # [num_tokens, kv_heads, head_dim]
    meta: AttentionMetadata,
    scaling: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:  # [num_tokens, heads, head_dim]
    """Write the new K/V of ``layer`` at the slot mapping (unless the caller did: ``key=None``), then
    attend each group over its requests' pages."""
    if key is not None:
        meta.kv_cache.write(layer, meta.slot_mapping, key, value)
    if meta.is_single_view:  # the usual batch-1 / uniform-decode case: no gather, no scatter
        o = _attend_group(meta.groups[0], layer, meta, query, None, scaling, sliding_window, softcap)
        return o.reshape(query.shape)
    out = torch.empty_like(query)
    for group in meta.groups:
        _attend_group(group, layer, meta, query, out, scaling, sliding_window, softcap)
    return out


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, heads, num_tokens, head_dim]
    key: torch.Tensor,  # [1, kv_heads, num_tokens, head_dim]
    value: torch.Tensor,  # [1, kv_heads, num_tokens, head_dim]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    paged_metadata: AttentionMetadata | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """`paged_attention` behind transformers' attention-function interface (the layer is
    ``module.layer_idx``); returns [1, num_tokens, heads, head_dim]."""
    if paged_metadata is None:
        raise RuntimeError(
            f"attention implementation {PAGED_ATTENTION!r} needs the `paged_metadata` keyword; "
            "this model is set up for specexec's executor, not for a plain forward"
        )
    if query.shape[0] != 1:
        raise ValueError(
            f"paged attention expects a flattened batch of shape [1, ...], got {tuple(query.shape)}"
        )
    q = query[0].transpose(0, 1)  # [num_tokens, heads, head_dim]
    scaling = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = paged_attention(
        module.layer_idx,
        q,
        key[0].transpose(0, 1),
        value[0].transpose(0, 1),
        paged_metadata,
        scaling,
        sliding_window,
        softcap,
    )
    return out.unsqueeze(0), None


def register_paged_attention() -> str:
    """Make ``PAGED_ATTENTION`` a valid ``attn_implementation`` (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(PAGED_ATTENTION, paged_attention_forward)
    return PAGED_ATTENTION
