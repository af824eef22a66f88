"""Attention over the paged KV cache, plugged into transformers' attention-function interface.

Any model whose attention modules call ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` runs
on our cache once ``register_paged_attention()`` has run and the model's implementation is set to
``PAGED_ATTENTION``. The per-forward ``AttentionMetadata`` arrives as the ``paged_metadata`` keyword.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention_metadata import AttentionGroup, AttentionMetadata

PAGED_ATTENTION = "specexec_paged"
LOW_PRECISION = (torch.bfloat16, torch.float16)
#: a batch of short low-precision queries (decode, verification rows) uses the matmul path on CPU
MAX_MATMUL_QUERY_LEN = 64


def attend(
    query: torch.Tensor,  # [group, heads, max_q, head_dim]
    key: torch.Tensor,  # [group, kv_heads, max_kv, head_dim]
    value: torch.Tensor,  # [group, kv_heads, max_kv, head_dim]
    mask: torch.Tensor | None,  # [group, 1, max_q, max_kv]
    scaling: float,
    softcap: float | None,
) -> torch.Tensor:  # [group, heads, max_q, head_dim]
    # SDPA on CPU is slow for bf16/fp16 in a padded batch of short queries, and for a lone decode query
    # (one query over 1.3k keys: 0.81 ms vs 0.20 ms as two fp32 matmuls; 2.6 vs 1.2 ms over 4k keys)
    batched_low_precision = (
        query.device.type == "cpu"
        and query.dtype in LOW_PRECISION
        and ((query.shape[0] > 1 and query.shape[2] <= MAX_MATMUL_QUERY_LEN) or query.shape[2] == 1)
    )
    if softcap is None and not batched_low_precision:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scaling, enable_gqa=True
        )
    return _attend_matmul(query, key, value, mask, scaling, softcap)


def _attend_matmul(query, key, value, mask, scaling: float, softcap: float | None) -> torch.Tensor:
    """Attention as two float32 matmuls, the query heads of each KV head stacked as rows (no K/V
    repeat). On CPU this beats SDPA several times over for a padded batch of short bfloat16 queries,
    and it does softcapping."""
    num, heads, max_q, head_dim = query.shape
    kv_heads = key.shape[1]
    rep = heads // kv_heads
    q = query.reshape(num, kv_heads, rep * max_q, head_dim).float()  # [group, kv_heads, rep*max_q, head_dim]
    scores = (q @ key.float().transpose(-1, -2)) * scaling  # [group, kv_heads, rep*max_q, max_kv], fp32
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        # [group, 1, max_q, max_kv] -> [group, 1, rep*max_q, max_kv]: every stacked head sees its query's row
        stacked = (
            mask.unsqueeze(2).expand(num, 1, rep, max_q, mask.shape[-1]).reshape(num, 1, rep * max_q, -1)
        )
        scores = scores.masked_fill(~stacked, float("-inf"))
    probs = scores.softmax(-1)  # accumulate in float32, as SDPA does
    return (probs @ value.float()).to(query.dtype).reshape(num, heads, max_q, head_dim)


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
    if group.kv_slice is not None:
        key, value = meta.kv_cache.gather(layer, group.kv_slice)  # [max_kv, kv_heads, head_dim]
        key, value = key.unsqueeze(0), value.unsqueeze(0)  # [1, max_kv, kv_heads, head_dim]
    else:
        key, value = meta.kv_cache.gather(layer, group.kv_slots)  # [group, max_kv, kv_heads, head_dim]
    q, key, value = q.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if softcap is None and group.uses_causal_kernel(sliding_window):  # a fresh prompt: SDPA's causal kernel
        o = F.scaled_dot_product_attention(q, key, value, is_causal=True, scale=scaling, enable_gqa=True)
    else:
        o = attend(q, key, value, group.mask(sliding_window), scaling, softcap)
    o = o.transpose(1, 2)  # [group, max_q, heads, head_dim]
    if out is None:
        return o  # [group, max_q, heads, head_dim]: the caller's whole output
    if group.query_slice is not None:
        out[group.query_slice] = o.reshape(num * max_q, *o.shape[2:])
    else:
        out.index_copy_(0, group.out_index, o.reshape(num * max_q, *o.shape[2:])[group.valid_rows])
    return o


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
    """Write the new K/V at the slot mapping, then attend each group over its requests' pages."""
    if paged_metadata is None:
        raise RuntimeError(
            f"attention implementation {PAGED_ATTENTION!r} needs the `paged_metadata` keyword; "
            "this model is set up for specexec's executor, not for a plain forward"
        )
    if query.shape[0] != 1:
        raise ValueError(
            f"paged attention expects a flattened batch of shape [1, ...], got {tuple(query.shape)}"
        )
    layer = module.layer_idx
    q = query[0].transpose(0, 1)  # [num_tokens, heads, head_dim]
    paged_metadata.kv_cache.write(
        layer, paged_metadata.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1)
    )
    scaling = scaling if scaling is not None else q.shape[-1] ** -0.5
    if paged_metadata.is_single_view:  # the usual batch-1 / uniform-decode case: no gather, no scatter
        o = _attend_group(
            paged_metadata.groups[0], layer, paged_metadata, q, None, scaling, sliding_window, softcap
        )
        return o.reshape(1, *q.shape), None  # [1, num_tokens, heads, head_dim]
    out = torch.empty_like(q)  # [num_tokens, heads, head_dim]
    for group in paged_metadata.groups:
        _attend_group(group, layer, paged_metadata, q, out, scaling, sliding_window, softcap)
    return out.unsqueeze(0), None  # [1, num_tokens, heads, head_dim]


def register_paged_attention() -> str:
    """Make ``PAGED_ATTENTION`` a valid ``attn_implementation`` (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(PAGED_ATTENTION, paged_attention_forward)
    return PAGED_ATTENTION
