"""The C++ CPU attention kernel against the torch path it replaces, on awkward shapes: every dtype, head
sizes on and off the vector width, grouped-query heads, sliding windows, soft caps, verify rows, padded
queries, shuffled pages; and the torch path when the kernel is switched off."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cpu_isa_builds import require_x86_64_linux_with_avx2, run_build
from paged_attention_cases import TOLERANCE, make_case
from specexec.executor.layers import cpu_kernels as kernels_module
from specexec.executor.layers.attention_kernels import MATMUL, PAGED_CPU
from specexec.executor.layers.cpu_kernels import cpu_kernels
from specexec.executor.layers.paged_attention_cpu import attend_paged_cpu
from specexec.executor.model.attention_paths import AttentionPaths
from specexec.executor.model.paged_attention import _attend_gathered


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size"),
    [(4, 2, 8, 4), (9, 3, 64, 16), (8, 8, 48, 4), (12, 3, 128, 16), (5, 1, 24, 8)],
)
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (5, None), (None, 7.5)])
def test_the_kernel_gives_the_torch_paths_output(
    dtype, heads, kv_heads, head_dim, block_size, window, softcap
):
    if cpu_kernels() is None:
        pytest.fail("the C++ CPU kernel did not build here (see the log); this machine has a compiler")
    query_lens, kv_lens = (
        [1, 4, 1, 3, 2],
        [1, 37, 17, 9, 60],
    )  # decode and verify rows, a fresh 1-token prompt
    cache, meta, query = make_case(dtype, heads, kv_heads, head_dim, block_size, query_lens, kv_lens)
    assert_the_kernel_gives_the_torch_paths_output(cache, meta, query, head_dim**-0.5, window, softcap)


def assert_the_kernel_gives_the_torch_paths_output(cache, meta, query, scale, window, softcap):
    """Every attention group of ``meta`` through the C++ kernel and through the torch path, its real rows
    within the dtype's tolerance."""
    heads, head_dim, dtype = query.shape[1], query.shape[2], query.dtype
    for group in meta.groups:
        num, max_q = group.num_queries, group.max_query_len
        q = (
            query[group.query_slice].view(num, max_q, heads, head_dim)
            if group.query_slice
            else query[group.query_index]
        )
        want = _attend_gathered(group, 0, meta, q, MATMUL, scale, window, softcap)
        got = attend_paged_cpu(
            q,
            cache.kv[0],
            group.block_tables,
            group.query_pos[..., 0],
            group.kv_lens,
            cache.block_size,
            scale,
            window,
            softcap,
        )
        assert got.shape == want.shape and got.dtype == dtype
        rows = group.valid_rows if group.valid_rows is not None else slice(None)
        got, want = (
            got.reshape(num * max_q, heads, head_dim)[rows],
            want.reshape(num * max_q, heads, head_dim)[rows],
        )
        torch.testing.assert_close(got.double(), want.double(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (300, None), (None, 7.5)])
def test_long_contexts_split_over_chunks_give_the_torch_paths_output(dtype, window, softcap):
    """Contexts of several of the kernel's 128-key chunks (each one task, merged afterwards), verify rows
    among them, a sliding window that starts inside a chunk."""
    if cpu_kernels() is None:
        pytest.fail("the C++ CPU kernel did not build here (see the log); this machine has a compiler")
    heads, kv_heads, head_dim, block_size = 9, 3, 64, 16
    cache, meta, query = make_case(dtype, heads, kv_heads, head_dim, block_size, [1, 4, 2], [1000, 515, 257])
    assert_the_kernel_gives_the_torch_paths_output(cache, meta, query, 0.125, window, softcap)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 100])
@pytest.mark.parametrize("seed", range(8))
def test_a_verify_row_is_the_same_token_decoded_alone_bit_for_bit(dtype, window, seed):
    """Each row's result depends only on its own keys, whatever the other rows of its request see: the
    greedy identity of speculative and plain decoding rests on it. (Eight seeds: a kernel that sums a
    4-query group's scores in another order than a lone query's differs in about 1 bfloat16 row in 6,
    the rest rounding alike.)"""
    if cpu_kernels() is None:
        pytest.fail("the C++ CPU kernel did not build here (see the log); this machine has a compiler")
    cache, meta, query = make_case(dtype, 9, 3, 64, 16, [4], [700], seed=seed)
    tables = meta.groups[0].block_tables
    q = query.view(1, 4, 9, 64)
    positions = torch.arange(696, 700)
    together = attend_paged_cpu(
        q, cache.kv[0], tables, positions[None], torch.tensor([700]), 16, 0.125, window, None
    )
    for t, position in enumerate(positions.tolist()):
        alone = attend_paged_cpu(
            q[:, t : t + 1],
            cache.kv[0],
            tables,
            torch.tensor([[position]]),
            torch.tensor([position + 1]),
            16,
            0.125,
            window,
            None,
        )
        assert torch.equal(together[:, t : t + 1], alone), f"row {t}"


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_split_over_threads_changes_no_bit(threads):
    """The chunks go to the threads in runs of equal work (short requests first, one long one last: the
    split is not by count); whichever thread takes a chunk, every request's result is the same."""
    if cpu_kernels() is None:
        pytest.fail("the C++ CPU kernel did not build here (see the log); this machine has a compiler")
    lens = [40, 9, 60, 33, 51, 20, 900]
    paths = AttentionPaths.all(PAGED_CPU)  # one group
    cache, meta, query = make_case(torch.bfloat16, 9, 3, 64, 16, [1] * 6 + [4], lens, paths=paths)
    (group,) = meta.groups
    q = query[group.query_index]
    args = (q, cache.kv[0], group.block_tables, group.query_pos[..., 0], group.kv_lens, 16, 0.125, None, None)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = attend_paged_cpu(*args)
        torch.set_num_threads(threads)
        assert torch.equal(attend_paged_cpu(*args), alone)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_len", [100, 300, 700])
def test_tasks_of_one_head_or_of_all_heads_give_the_same_bits(dtype, kv_len):
    """A chunk's KV heads are one task, or one task each where a request has fewer than two chunks a
    thread (1 chunk at 100 keys, 3 at 300, 6 at 700: each is split at some of 1 to 4 threads, and
    not at others); a row's result must not depend on which."""
    if cpu_kernels() is None:
        pytest.fail("the C++ CPU kernel did not build here (see the log); this machine has a compiler")
    cache, meta, query = make_case(dtype, 9, 3, 64, 16, [4], [kv_len])
    positions = torch.arange(kv_len - 4, kv_len)[None]
    args = (query.view(1, 4, 9, 64), cache.kv[0], meta.groups[0].block_tables, positions)
    args += (torch.tensor([kv_len]), 16, 0.125, None, None)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3, 4):
            torch.set_num_threads(threads)
            results.append(attend_paged_cpu(*args))
    finally:
        torch.set_num_threads(before)
    for threads, got in zip((2, 3, 4), results[1:]):
        assert torch.equal(got, results[0]), f"{threads} threads"
    assert_the_kernel_gives_the_torch_paths_output(cache, meta, query, 0.125, None, None)


@pytest.mark.parametrize("kv_len", [301, 1300])
def test_bfloat16_attention_is_about_as_close_to_the_exact_answer_as_its_rounding(kv_len):
    """bfloat16 pools take the CPU's bfloat16 dot product where it has one (keys, and the values with the
    probabilities rounded to bfloat16, as flash attention does on GPUs): the mean error against the
    float64 answer stays within 2x that of rounding the float64 answer itself to bfloat16 (measured:
    about 1.5x). An odd key count leaves the last key without a partner in the values' pairs."""
    if cpu_kernels() is None:
        pytest.fail("the C++ CPU kernel did not build here (see the log); this machine has a compiler")
    cache, meta, query = make_case(torch.bfloat16, 9, 3, 64, 16, [4], [kv_len])
    args = (meta.groups[0].block_tables, torch.arange(kv_len - 4, kv_len)[None], torch.tensor([kv_len]))
    args += (16, 0.125, None, None)
    q = query.view(1, 4, 9, 64)
    exact = attend_paged_cpu(q.double(), cache.kv[0].double(), *args)
    got = attend_paged_cpu(q, cache.kv[0], *args).double()
    rounding = (exact.to(torch.bfloat16).double() - exact).abs().mean()
    assert (got - exact).abs().mean() <= 2 * rounding


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_len", [45, 301])
def test_slots_a_request_does_not_own_never_reach_its_output(dtype, kv_len):
    """Every slot outside the request's keys holds NaN (pages of other requests, the rest of its last
    page): nothing of them may reach the result, not even times a zero probability (an odd number of
    keys leaves the bfloat16 values' last pair one key short)."""
    if cpu_kernels() is None:
        pytest.fail("the C++ CPU kernel did not build here (see the log); this machine has a compiler")
    cache, meta, query = make_case(dtype, 9, 3, 64, 16, [3], [kv_len])
    tables = meta.groups[0].block_tables
    owned = torch.zeros(cache.kv.shape[2], dtype=torch.bool)
    for k in range(kv_len):
        owned[tables[0, k // 16] * 16 + k % 16] = True
    args = (tables, torch.arange(kv_len - 3, kv_len)[None], torch.tensor([kv_len]), 16, 0.125, None, None)
    q = query.view(1, 3, 9, 64)
    want = attend_paged_cpu(q, cache.kv[0], *args)
    cache.kv[:, :, ~owned] = float("nan")
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert torch.equal(attend_paged_cpu(q, cache.kv[0], *args), want), f"{threads} threads"
    finally:
        torch.set_num_threads(before)


def test_a_padded_request_attends_key_0_as_the_torch_mask_does():
    """A captured shape pads its batch with requests of no keys (kv_len 0): their rows are never read,
    but they must not divide by zero; like the torch mask, they attend key 0 of their first page."""
    cache, meta, query = make_case(torch.float32, 4, 2, 16, 4, [1], [10])
    tables = meta.groups[0].block_tables
    q = query.view(1, 1, 4, 16)
    out = attend_paged_cpu(
        q, cache.kv[0], tables, torch.tensor([[0]]), torch.tensor([0]), 4, 0.25, None, None
    )
    value = cache.kv[0, 1, tables[0, 0] * 4]  # [kv_heads, head_dim] of key 0
    torch.testing.assert_close(out[0, 0], value.repeat_interleave(2, dim=0))


def test_switched_off_the_kernel_is_not_loaded_and_attention_runs_on_torch(monkeypatch):
    from specexec.executor.model.paged_attention import paged_attention

    cache, meta, query = make_case(torch.float32, 4, 2, 16, 4, [1, 1], [7, 12])
    k = torch.randn(2, 2, 16)
    on = paged_attention(0, query, k, k, meta, 0.25)
    monkeypatch.setenv(kernels_module.SWITCH, "0")
    cpu_kernels.cache_clear()
    try:
        assert cpu_kernels() is None
        off = paged_attention(0, query, k, k, meta, 0.25)
    finally:
        monkeypatch.delenv(kernels_module.SWITCH)
        cpu_kernels.cache_clear()
    torch.testing.assert_close(on, off, rtol=2e-6, atol=2e-6)
    assert cpu_kernels() is not None, "back on once the switch is gone"


ISA_BODY = "result = [ops.paged_attention_short(*args) for args in inputs]"


@pytest.mark.slow
def test_the_avx2_build_gives_this_builds_results(tmp_path):
    """The AVX2 vector path (8 lanes: its own transposing sum, max and exponent), built apart: this CPU
    may run the AVX-512 one. A NaN in a key reaches the rows that see it there too."""
    from specexec.executor.layers import paged_attention_cpu

    require_x86_64_linux_with_avx2()
    calls = []
    for dtype, window, softcap in [
        (torch.float32, None, None),
        (torch.bfloat16, 300, None),
        (torch.float16, None, 7.5),
    ]:
        cache, meta, query = make_case(dtype, 9, 3, 64, 16, [4], [700])
        tables = meta.groups[0].block_tables
        cache.kv[0, 0, tables[0, 500 // 16] * 16 + 500 % 16, 1, 7] = float("nan")  # key 500, KV head 1
        positions = torch.arange(696, 700)[None]
        args = (query.view(1, 4, 9, 64), cache.kv[0], tables, positions, torch.tensor([700]), 16, 0.125)
        calls.append((*args, window or 0, softcap or 0.0))
    source = Path(paged_attention_cpu.__file__).with_name("paged_attention_cpu.cpp")
    for got, args in zip(run_build(tmp_path, source, ["-march=x86-64-v3"], calls, ISA_BODY), calls):
        # every query sees key 500: the heads of KV head 1 come out NaN, the others not
        assert got[0, :, 3:6].isnan().all() and not got[0, :, :3].isnan().any()
        want = cpu_kernels().paged_attention_short(*args)
        tolerance = TOLERANCE[args[0].dtype]
        torch.testing.assert_close(
            got.double(), want.double(), rtol=tolerance, atol=tolerance, equal_nan=True
        )
