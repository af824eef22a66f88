"""Slots past a request's keys never reach its output on the torch attention path. A freed page keeps its
last owner's K/V (a failed request's NaN or Inf) in the slots its next owner has not written yet, a rejected
draft leaves its K/V past the rewound length, and a table may hold a page past a request's keys. The torch
kernels read whole pages, and a masked key's weight 0 times a NaN or Inf value is NaN (a NaN or Inf key
beside SDPA's additive -inf mask is NaN too), so one request's failure would spread to the next owner of
its pages."""

from __future__ import annotations

import random

import pytest
import torch
from paged_attention_cases import (
    BLOCK,
    HEAD_DIM,
    KV_HEADS,
    SHAPES,
    STATIC_SHAPES,
    make_qkv,
    plain_attention,
    ragged_batch,
    run_layer,
    run_static_layer,
)
from specexec.executor.model.attention_metadata import SequenceSlice
from specexec.executor.model.attention_paths import AttentionPaths
from specexec.executor.model.graph_shapes import GraphShape
from specexec.executor.model.kv_cache import KVCache, KVCacheSpec

NUM_BLOCKS = 64


def with_a_spare_page(seqs: list[SequenceSlice]) -> list[SequenceSlice]:
    """Each request holding one page more than its keys need (slots taken ahead of its drafts)."""
    used = {page for s in seqs for page in s.block_table}
    spare = [page for page in range(NUM_BLOCKS) if page not in used]
    return [
        SequenceSlice(s.query_start, s.query_len, s.start_pos, [*s.block_table, spare[i]])
        for i, s in enumerate(seqs)
    ]


def poison_every_slot_but_the_keys(cache: KVCache, seqs: list[SequenceSlice], value: float) -> None:
    """``value`` in every slot of every page but the requests' own keys and the padding page (which holds
    zeros or padding tokens' K/V only): the tails of their last pages, their spare pages, free pages."""
    keys = {s.block_table[p // BLOCK] * BLOCK + p % BLOCK for s in seqs for p in range(s.kv_len)}
    padding = range(cache.padding_block * BLOCK, (cache.padding_block + 1) * BLOCK)
    stale = [slot for slot in range(cache.kv.shape[2]) if slot not in keys and slot not in padding]
    cache.kv[:, :, stale] = value


def poisoned_case(shapes, value):
    torch.manual_seed(0)
    cache = KVCache(KVCacheSpec(1, KV_HEADS, HEAD_DIM, torch.float32), NUM_BLOCKS, BLOCK, torch.device("cpu"))
    cache.kv.normal_()
    seqs = with_a_spare_page(ragged_batch(random.Random(str(shapes)), NUM_BLOCKS - len(shapes), shapes))
    poison_every_slot_but_the_keys(cache, seqs, value)
    return cache, seqs, make_qkv(sum(new for _, new in shapes))


@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("path", ["sdpa", "matmul"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_stale_slots_do_not_reach_the_output(shapes, path, value):
    cache, seqs, (query, key, value_) = poisoned_case(shapes, value)
    _, out = run_layer(cache, seqs, query, key, value_, AttentionPaths.all(path))
    assert out.isfinite().all()
    torch.testing.assert_close(out.double(), plain_attention(cache, 0, seqs, query), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shapes", STATIC_SHAPES)
@pytest.mark.parametrize("path", ["sdpa", "matmul"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_stale_slots_do_not_reach_a_captured_forwards_output(shapes, path, value):
    """Through a captured forward's buffers (4 sequences of 4 queries over 12 pages), as in
    `test_captured_layout_attention_equals_plain_attention`."""
    cache, seqs, (query, key, value_) = poisoned_case(shapes, value)
    shape = GraphShape(num_seqs=4 if len(seqs) > 1 else 1, query_len=4, num_blocks=12)
    out = run_static_layer(cache, seqs, query, key, value_, shape, AttentionPaths.all(path))
    assert out.isfinite().all()
    torch.testing.assert_close(out.double(), plain_attention(cache, 0, seqs, query), atol=1e-5, rtol=1e-5)
