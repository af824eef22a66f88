"""Paged attention metadata: built from host integers in one copy, read through block tables, the same
answer as plain attention per request (also through a captured forward's fixed-shape buffers, whose
padding writes only the padding page), and no read back from the device."""

from __future__ import annotations

import random

import pytest
import torch
from paged_attention_cases import (
    BLOCK,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    SHAPES,
    STATIC_SHAPES,
    make_qkv,
    plain_attention,
    ragged_batch,
    run_layer,
    run_static_layer,
    slots_of,
)
from specexec.executor.model.attention_metadata import AttentionMetadata
from specexec.executor.model.attention_paths import AttentionPaths
from specexec.executor.model.graph_shapes import GraphShape
from specexec.executor.model.kv_cache import KVCache, KVCacheSpec


@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("path", ["sdpa", "matmul", "paged_cpu"])
def test_paged_attention_equals_plain_attention_per_request(shapes, path):
    rng = random.Random(str(shapes))
    torch.manual_seed(0)
    cache = KVCache(KVCacheSpec(1, KV_HEADS, HEAD_DIM, torch.float32), 64, BLOCK, torch.device("cpu"))
    cache.kv.normal_()
    seqs = ragged_batch(rng, 64, shapes)
    query, key, value = make_qkv(sum(new for _, new in shapes))
    _, out = run_layer(cache, seqs, query, key, value, AttentionPaths.all(path))
    torch.testing.assert_close(out.double(), plain_attention(cache, 0, seqs, query), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shapes", STATIC_SHAPES)
@pytest.mark.parametrize("path", ["sdpa", "matmul"])
def test_captured_layout_attention_equals_plain_attention(shapes, path):
    """Through a captured forward's fixed-shape buffers (the batch padded to 4 sequences of 4 queries
    over 12 pages): the real rows are plain attention's, and the padding tokens' K/V land in the
    padding page only."""
    torch.manual_seed(1)
    cache = KVCache(KVCacheSpec(1, KV_HEADS, HEAD_DIM, torch.float32), 64, BLOCK, torch.device("cpu"))
    cache.kv.normal_()
    before = cache.kv.clone()
    seqs = ragged_batch(random.Random(str(shapes)), 64, shapes)
    query, key, value = make_qkv(sum(new for _, new in shapes))
    shape = GraphShape(num_seqs=4 if len(seqs) > 1 else 1, query_len=4, num_blocks=12)
    out = run_static_layer(cache, seqs, query, key, value, shape, AttentionPaths.all(path))
    torch.testing.assert_close(out.double(), plain_attention(cache, 0, seqs, query), atol=1e-5, rtol=1e-5)
    written = set(slots_of(seqs).tolist())
    padding = set(range(cache.padding_block * BLOCK, (cache.padding_block + 1) * BLOCK))
    untouched = [slot for slot in range(cache.kv.shape[2]) if slot not in written | padding]
    assert torch.equal(cache.kv[:, :, untouched], before[:, :, untouched])
    new_keys = cache.kv[0, 0, slots_of(seqs)]
    assert torch.equal(new_keys, key), "every real token's key is written at its own slot"


def test_nothing_is_read_back_from_the_device(monkeypatch):
    """Building the metadata and running a layer decide everything from host integers."""
    cache = KVCache(KVCacheSpec(1, KV_HEADS, HEAD_DIM, torch.float32), 64, BLOCK, torch.device("cpu"))
    seqs = ragged_batch(random.Random(1), 64, [(5, 4), (17, 2), (0, 7), (30, 1)])
    n = 14
    inputs = (
        torch.randn(n, HEADS, HEAD_DIM),
        torch.randn(n, KV_HEADS, HEAD_DIM),
        torch.randn(n, KV_HEADS, HEAD_DIM),
    )

    def sync(*args, **kwargs):
        raise AssertionError("a device value was read on the host")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    run_layer(cache, seqs, *inputs, AttentionPaths())
    run_static_layer(cache, seqs, *inputs, GraphShape(4, 8, 16), AttentionPaths())


def test_gather_pages_reads_whole_pages_in_table_order():
    cache = KVCache(KVCacheSpec(2, KV_HEADS, HEAD_DIM, torch.float32), 8, BLOCK, torch.device("cpu"))
    cache.kv.normal_()
    tables = torch.tensor([[3, 1], [0, 7]])
    key, value = cache.gather_pages(1, tables)
    assert key.shape == (2, 2 * BLOCK, KV_HEADS, HEAD_DIM)
    slots = (tables[:, :, None] * BLOCK + torch.arange(BLOCK)).reshape(2, -1)
    assert torch.equal(key, cache.kv[1, 0, slots]) and torch.equal(value, cache.kv[1, 1, slots])


def test_kernel_choice_is_measured_once_per_machine_and_cached(tmp_path, monkeypatch):
    import specexec.executor.kernel_plan.attention_path as paths_module
    from specexec.executor.kernel_plan.attention_path import choose_attention_paths
    from specexec.executor.model.attention_paths import CASES, CONTEXTS

    calls = []
    real = paths_module.measure_attention_paths
    monkeypatch.setattr(paths_module, "CONTEXTS", (16, 64))  # tiny timings
    monkeypatch.setattr(
        paths_module, "measure_attention_paths", lambda *a, **k: calls.append(a) or real(*a, **k)
    )
    cpu = torch.device("cpu")
    first = choose_attention_paths(HEADS, KV_HEADS, HEAD_DIM, torch.float32, cpu, tmp_path)
    again = choose_attention_paths(HEADS, KV_HEADS, HEAD_DIM, torch.float32, cpu, tmp_path)
    assert first == again and len(calls) == 1, "the second executor reads the cached choice"
    assert all(p in ("sdpa", "matmul", "paged_cpu") for p in first.short_context + first.long_context)
    assert len(first.short_context) == len(first.long_context) == len(CASES) and len(CONTEXTS) == 2
    (cached,) = tmp_path.glob("attention-paths-*.json")
    cached.write_text("{not json")  # damaged: measured again, not trusted
    assert choose_attention_paths(HEADS, KV_HEADS, HEAD_DIM, torch.float32, cpu, tmp_path) is not None
    assert len(calls) == 2
    cuda = choose_attention_paths(HEADS, KV_HEADS, HEAD_DIM, torch.bfloat16, torch.device("cuda"), None)
    assert cuda == AttentionPaths.all("paged_triton"), "CUDA: the Triton kernel over the pages, unmeasured"
    cuda = choose_attention_paths(HEADS, KV_HEADS, HEAD_DIM, torch.float64, torch.device("cuda"), None)
    assert cuda == AttentionPaths.all("sdpa"), "float64 stays on SDPA"


def test_without_the_cpp_kernel_the_choice_is_between_the_torch_kernels(tmp_path, monkeypatch):
    from specexec.executor.kernel_plan import attention_path as paths_module
    from specexec.executor.layers import cpu_kernels as kernels_module

    monkeypatch.setattr(paths_module, "CONTEXTS", (16, 64))  # tiny timings
    monkeypatch.setenv(kernels_module.SWITCH, "0")
    kernels_module.cpu_kernels.cache_clear()
    try:
        paths = paths_module.choose_attention_paths(
            HEADS, KV_HEADS, HEAD_DIM, torch.float32, torch.device("cpu"), tmp_path
        )
        assert all(p in ("sdpa", "matmul") for p in paths.short_context + paths.long_context)
    finally:
        kernels_module.cpu_kernels.cache_clear()


def test_each_group_takes_the_kernel_of_its_case_and_context():
    from specexec.executor.model.attention_paths import CONTEXT_SPLIT

    paths = AttentionPaths(("matmul", "sdpa", "sdpa", "matmul"), ("sdpa", "matmul", "matmul", "sdpa"))
    short, long = CONTEXT_SPLIT - 1, CONTEXT_SPLIT
    assert [paths.for_group(1, True, 1, short), paths.for_group(1, True, 8, short)] == ["matmul", "sdpa"]
    assert [paths.for_group(4, True, 1, short), paths.for_group(4, True, 8, short)] == ["sdpa", "matmul"]
    assert [paths.for_group(1, True, 1, long), paths.for_group(4, True, 8, long)] == ["sdpa", "sdpa"]
    assert paths.for_group(200, False, 1, long) == "sdpa"  # prefill chunks: SDPA


def test_short_queries_share_one_group_where_the_kernel_reads_each_requests_own_keys():
    """Padding a group in keys costs the torch kernels (they attend over the longest request's keys), so
    a decode row over 5 keys is not grouped with one over 300; the kernels that read the pages in place
    read each request's own keys, so every short query joins one group (one call a layer) and only a
    long prefill chunk stays alone."""
    shapes = [(4, 1), (300, 1), (20, 4), (3, 70), (9, 2)]
    cache = KVCache(KVCacheSpec(1, KV_HEADS, HEAD_DIM, torch.float32), 128, BLOCK, torch.device("cpu"))
    seqs = ragged_batch(random.Random(0), 128, shapes)
    torch_paths = AttentionMetadata.build(cache, slots_of(seqs), seqs, BLOCK, AttentionPaths.all("matmul"))
    assert len(torch_paths.groups) > 2
    for path in ("paged_cpu", "paged_triton"):
        paths = AttentionPaths.all(path)
        assert paths.batches_read_pages_in_place()
        meta = AttentionMetadata.build(cache, slots_of(seqs), seqs, BLOCK, paths)
        assert [g.num_queries for g in meta.groups] == [4, 1]
        assert [g.is_short for g in meta.groups] == [True, False]
        assert meta.groups[0].out_index.tolist() == [0, 1, 2, 3, 4, 5, 76, 77], "in batch order"
    mixed = AttentionPaths(("paged_cpu",) * 4, ("paged_cpu", "matmul", "paged_cpu", "paged_cpu"))
    assert not mixed.batches_read_pages_in_place()
    assert not AttentionPaths().batches_read_pages_in_place(), "unmeasured: the torch path may run"
