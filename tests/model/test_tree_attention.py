"""Token trees in attention: each tree row attends every cached key and, of the step's new keys, only
its own ancestors and itself. The C++ kernel and the torch path's mask against a direct float64
reference, on trees that cross the kernel's 128-key chunks, beside chain and decode rows in one group."""

from __future__ import annotations

import random

import pytest
import torch
from specexec.executor.layers.attention_kernels import MATMUL, PAGED_CPU, SDPA
from specexec.executor.layers.cpu_kernels import cpu_kernels
from specexec.executor.layers.paged_attention_cpu import attend_paged_cpu
from specexec.executor.model.attention_metadata import AttentionMetadata, SequenceSlice
from specexec.executor.model.attention_paths import AttentionPaths
from specexec.executor.model.kv_cache import KVCache, KVCacheSpec
from specexec.executor.model.paged_attention import _attend_gathered, paged_attention
from specexec.sampling.tree_shape import depths, first_branch, pruned, row_ancestor_bits, trie_of_chains

TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 2e-2}
TREE = [-1, -1, 0, 0, 1, 2, 2, 5, -1]  # three root children, branches of depth 1..4


def _case(dtype, kinds, block_size=16, seed=0):
    """kinds: per request (cached keys, parents or None for a chain, query length)."""
    gen = torch.Generator().manual_seed(seed)
    heads, kv_heads, head_dim = 6, 2, 64
    kv_lens = [cached + q_len for cached, _, q_len in kinds]
    num_blocks = sum(-(-n // block_size) for n in kv_lens) + 3
    cache = KVCache(KVCacheSpec(1, kv_heads, head_dim, dtype), num_blocks, block_size, torch.device("cpu"))
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen).to(dtype))
    pages = list(range(num_blocks))
    random.Random(seed).shuffle(pages)
    seqs, start = [], 0
    for (cached, parents, q_len), kv_len in zip(kinds, kv_lens):
        need = -(-kv_len // block_size)
        bits = row_ancestor_bits(parents) if parents is not None else None
        seqs.append(SequenceSlice(start, q_len, cached, pages[:need], bits))
        pages, start = pages[need:], start + q_len
    slots = torch.tensor(
        [
            s.block_table[p // block_size] * block_size + p % block_size
            for s in seqs
            for p in range(s.start_pos, s.kv_len)
        ]
    )
    meta = AttentionMetadata.build(cache, slots, seqs, block_size, AttentionPaths.all(PAGED_CPU))  # one group
    query = torch.randn(start, heads, head_dim, generator=gen).to(dtype)
    return cache, meta, seqs, query


def tree_attention_reference(cache, seq, parents, query_rows, scale, window=None):
    """Each row of one request over the keys it may see, directly, in float64: [q_len, heads, head_dim].
    With a sliding ``window``, a row at position p (a tree row: the root's plus its depth) sees the
    cached keys after p - window."""
    bs = cache.block_size
    slot = [seq.block_table[p // bs] * bs + p % bs for p in range(seq.kv_len)]
    k, v = cache.kv[0, 0, slot].double(), cache.kv[0, 1, slot].double()  # [kv, kv_heads, D]
    rep = query_rows.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # [kv, heads, D]
    out = []
    row_depths = [0] + depths(parents) if parents is not None else list(range(seq.query_len))
    for t in range(seq.query_len):
        oldest = seq.start_pos + row_depths[t] - window + 1 if window else 0
        if parents is None:
            seen = list(range(max(0, oldest), seq.start_pos + t + 1))
        else:
            bits = row_ancestor_bits(parents)[t] & (2**64 - 1)
            new = [seq.start_pos + j for j in range(seq.query_len) if bits >> j & 1]
            seen = list(range(max(0, oldest), seq.start_pos)) + new
        scores = torch.einsum("hd,khd->hk", query_rows[t].double() * scale, k[seen])
        out.append(torch.einsum("hk,khd->hd", scores.softmax(-1), v[seen]))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cached", [0, 5, 120, 300])
def test_tree_rows_attend_their_ancestors_only(dtype, cached):
    """A tree beside a chain and a decode row; 120 cached keys put the tree across a 128-key chunk."""
    kinds = [(cached, TREE, 1 + len(TREE)), (40, None, 4), (77, None, 1)]
    cache, meta, seqs, query = _case(dtype, kinds)
    (group,) = meta.groups
    scale = 0.125
    q = query[group.query_index] if group.query_slice is None else query.view(len(seqs), -1, 6, 64)
    wanted = [
        tree_attention_reference(cache, s, kind[1], query[s.query_start : s.query_start + s.query_len], scale)
        for s, kind in zip(seqs, kinds)
    ]
    outputs = {
        "matmul": _attend_gathered(group, 0, meta, q, MATMUL, scale, None, None),
        "sdpa": _attend_gathered(group, 0, meta, q, SDPA, scale, None, None),
    }
    if cpu_kernels() is not None:
        outputs["c++"] = attend_paged_cpu(
            q, cache.kv[0], group.block_tables, group.query_pos[..., 0], group.kv_lens, cache.block_size,
            scale, None, None, group.tree_bits,
        )  # fmt: skip
    for name, got in outputs.items():
        for g, (s, want) in enumerate(zip(seqs, wanted)):
            torch.testing.assert_close(
                got[g, : s.query_len].double(), want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype], msg=name
            )


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("path", [PAGED_CPU, MATMUL, SDPA])
def test_a_sliding_window_cuts_each_tree_row_at_its_depth_not_its_slot(dtype, path):
    """Node i sits in slot root + 1 + i but at position root + depth(i): a window of 100 keys over 300
    cached ones lets a depth-1 node see keys a slot-cut window would drop. Through `paged_attention`,
    on every path (the C++ kernel cuts by slot, so such a group goes to torch ops)."""
    window = 100
    kinds = [(300, TREE, 1 + len(TREE)), (140, None, 4), (77, None, 1)]
    cache, meta, seqs, query = _case(dtype, kinds)
    meta = AttentionMetadata.build(
        cache, meta.slot_mapping, seqs, cache.block_size, AttentionPaths.all(path)
    )  # the same group, attended on `path`
    got = paged_attention(0, query, None, None, meta, 0.125, window)  # [T, heads, head_dim]
    for s, (_, parents, _) in zip(seqs, kinds):
        rows = slice(s.query_start, s.query_start + s.query_len)
        want = tree_attention_reference(cache, s, parents, query[rows], 0.125, window)
        torch.testing.assert_close(got[rows].double(), want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def test_the_cpu_kernels_are_built_here():
    if cpu_kernels() is None:
        pytest.fail("the C++ CPU kernel did not build here (see the log); this machine has a compiler")


def test_tree_shapes():
    assert depths(TREE) == [1, 1, 2, 2, 2, 3, 3, 4, 1]
    assert first_branch(TREE) == [0, 2, 5, 7]
    bits = row_ancestor_bits(TREE)
    assert bits[0] == 1 and bits[1 + 7] == 1 | 1 << 1 | 1 << 3 | 1 << 6 | 1 << 8
    kept, parents = pruned(TREE, [d <= 2 for d in depths(TREE)])
    assert kept == [0, 1, 2, 3, 4, 8] and parents == [-1, -1, 0, 0, 1, -1]
    tokens, parents = trie_of_chains([(5, 6, 7), (5, 8), (9,), (5, 6, 2, 3)], max_nodes=5, max_depth=3)
    assert tokens == [5, 6, 7, 8, 9] and parents == [-1, 0, 1, 0, -1]
