"""Paged attention's inputs built in tests: requests on shuffled pages of a pool, their q/k/v, their
attention metadata, and plain attention per request to hold the kernels' output against.

- for the model's paths (`run_layer`, `run_static_layer` through a captured forward's buffers):
  fixed head counts, `SHAPES` and `STATIC_SHAPES` of (cached, new) tokens, `ragged_batch`, `make_qkv`,
  and `plain_attention`;
- for the C++ CPU kernel: `make_case` of any dtype and shape, and its `TOLERANCE` per dtype.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from specexec.executor.model.attention_metadata import AttentionMetadata, SequenceSlice
from specexec.executor.model.attention_paths import AttentionPaths
from specexec.executor.model.forward_io import SequenceInput
from specexec.executor.model.graph_shapes import GraphShape
from specexec.executor.model.kv_cache import KVCache, KVCacheSpec
from specexec.executor.model.paged_attention import paged_attention_forward
from specexec.executor.model.static_batch import StaticInputs

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4, 2, 8, 4
SHAPES = [
    [(0, 9)],  # a fresh prompt
    [(13, 1)],  # one decode row
    [(13, 4)],  # one verify row
    [(5, 1), (17, 1), (30, 1)],  # ragged decode
    [(5, 4), (17, 2), (0, 7), (30, 1)],  # verify rows, a prompt and a decode row together
    [(3, 70), (20, 4)],  # a long chunk goes alone
]
STATIC_SHAPES = [
    [(13, 1)],  # one decode row in a batch-1 shape
    [(5, 1), (17, 1), (30, 1)],  # ragged decode in a batch-4 shape: one padding sequence
    [(5, 4), (17, 2), (0, 3), (30, 1)],  # verify rows of every length, a short prompt
    [(40, 4), (2, 1)],  # a context near the shape's page limit
]

TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float16: 2e-3}


class Layer(torch.nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.layer_idx = index


def ragged_batch(rng: random.Random, num_blocks: int, shapes: list[tuple[int, int]]):
    """SequenceSlices for (cached, new) token counts, on shuffled (non-consecutive) pages."""
    free = list(range(num_blocks))
    rng.shuffle(free)
    seqs, start = [], 0
    for cached, new in shapes:
        pages = -(-(cached + new) // BLOCK)
        table, free = free[:pages], free[pages:]
        seqs.append(SequenceSlice(start, new, cached, table))
        start += new
    return seqs


def slots_of(seqs: list[SequenceSlice]) -> torch.Tensor:
    return torch.tensor(
        [s.block_table[p // BLOCK] * BLOCK + p % BLOCK for s in seqs for p in range(s.start_pos, s.kv_len)]
    )


def plain_attention(cache: KVCache, layer: int, seqs, query: torch.Tensor) -> torch.Tensor:
    """Plain attention per request over its cached and new keys, float64."""
    outs = []
    for s in seqs:
        slots = torch.tensor([s.block_table[p // BLOCK] * BLOCK + p % BLOCK for p in range(s.kv_len)])
        k, v = cache.kv[layer, 0, slots].double(), cache.kv[layer, 1, slots].double()  # [kv, kv_heads, dim]
        q = query[s.query_start : s.query_start + s.query_len].double()  # [q, heads, dim]
        pos_q = torch.arange(s.start_pos, s.kv_len)[:, None]
        mask = torch.arange(s.kv_len)[None, :] <= pos_q  # [q, kv]
        outs.append(
            F.scaled_dot_product_attention(
                q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, enable_gqa=True
            ).transpose(0, 1)
        )
    return torch.cat(outs)


def attend(meta, query, key, value) -> torch.Tensor:
    out, _ = paged_attention_forward(
        Layer(0),
        query.transpose(0, 1)[None],
        key.transpose(0, 1)[None],
        value.transpose(0, 1)[None],
        None,
        paged_metadata=meta,
    )
    return out[0]  # [num_tokens, heads, dim]


def run_layer(cache, seqs, query, key, value, paths=None):
    meta = AttentionMetadata.build(cache, slots_of(seqs), seqs, BLOCK, paths)
    return meta, attend(meta, query, key, value)


def run_static_layer(cache, seqs, query, key, value, shape: GraphShape, paths=None) -> torch.Tensor:
    """The same layer through a captured forward's buffers: the step written into ``shape``, the ragged
    q/k/v scattered into its padded flat batch (padding rows random), the real rows gathered back."""
    inputs = StaticInputs(cache, shape)
    step = [SequenceInput([0] * s.query_len, s.start_pos, s.block_table, s.query_len) for s in seqs]
    layout = inputs.write(step, shape)
    views = inputs.views(shape)
    real = views.tokens[: layout.num_tokens]

    def padded(x):  # [num_tokens, ...] -> [B * Q, ...]
        return torch.randn(shape.num_tokens, *x.shape[1:], dtype=x.dtype).index_copy_(0, real, x)

    meta = inputs.metadata(views, paths or AttentionPaths())
    return attend(meta, padded(query), padded(key), padded(value))[real]


def make_qkv(n: int):
    return (
        torch.randn(n, HEADS, HEAD_DIM),
        torch.randn(n, KV_HEADS, HEAD_DIM),
        torch.randn(n, KV_HEADS, HEAD_DIM),
    )


def make_case(dtype, heads, kv_heads, head_dim, block_size, query_lens, kv_lens, seed=0, paths=None):
    """A pool with random keys and values, requests on shuffled pages, and their attention metadata."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in kv_lens) + 3
    cache = KVCache(KVCacheSpec(1, kv_heads, head_dim, dtype), num_blocks, block_size, torch.device("cpu"))
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen).to(dtype))
    pages = list(range(num_blocks))
    random.Random(seed).shuffle(pages)
    seqs, start = [], 0
    for q_len, kv_len in zip(query_lens, kv_lens):
        need = -(-kv_len // block_size)
        seqs.append(SequenceSlice(start, q_len, kv_len - q_len, pages[:need]))
        pages, start = pages[need:], start + q_len
    slots = torch.tensor(
        [
            s.block_table[p // block_size] * block_size + p % block_size
            for s in seqs
            for p in range(s.start_pos, s.kv_len)
        ]
    )
    meta = AttentionMetadata.build(cache, slots, seqs, block_size, paths)
    query = torch.randn(start, heads, head_dim, generator=gen).to(dtype)  # [tokens, heads, head_dim]
    return cache, meta, query
