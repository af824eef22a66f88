"""The C++ CPU ops check every index and shape they read or write through before touching memory, as
the torch ops they replace do: a slot past the KV pool, a block-table page past the pool, a length past
its table, index tensors of the wrong shape, a residual or rotary rows of another shape raise a
RuntimeError that names the argument, and nothing is written. (Unchecked, the C++ ops had read or
written past their tensors: garbage out, or the heap corrupted.)"""

from __future__ import annotations

import pytest
import torch
from specexec.executor.layers.cpu_kernels import cpu_kernels

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_SLOTS = 4, 2, 8, 4, 16  #: a pool of 4 pages of 4 slots


pytestmark = pytest.mark.usefixtures("cpu_ops_built")


def make_pool() -> torch.Tensor:  # [2, slots, kv_heads, head_dim]
    return torch.randn(2, NUM_SLOTS, KV_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0))


def make_rotary_args(slots: list[int]):
    """rotary_kv_write's arguments for len(slots) tokens, written at ``slots``."""
    tokens = len(slots)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
    rows = torch.randn(tokens, 2, 1, HEAD_DIM)
    return qkv, rows, make_pool(), torch.tensor(slots), HEADS, KV_HEADS, HEAD_DIM


@pytest.mark.parametrize("bad_slot", [NUM_SLOTS, -1, 10**12])
def test_a_slot_outside_the_pool_raises_and_writes_nothing(bad_slot):
    qkv, rows, pool, slots, *heads = make_rotary_args([3, bad_slot, 5])
    before = pool.clone()
    with pytest.raises(RuntimeError, match=rf"slots\[1\] = {bad_slot} is out of range"):
        cpu_kernels().rotary_kv_write(qkv, rows, pool, slots, *heads)
    assert torch.equal(pool, before)
    with pytest.raises((IndexError, RuntimeError)):  # as torch's cache write refuses it
        pool[0].index_copy_(0, slots, torch.zeros(3, KV_HEADS, HEAD_DIM))


def test_rotary_rows_and_slots_of_another_length_raise():
    qkv, rows, pool, slots, *heads = make_rotary_args([3, 4, 5])
    with pytest.raises(RuntimeError, match="rows must be"):
        cpu_kernels().rotary_kv_write(qkv, rows[:2], pool, slots, *heads)
    with pytest.raises(RuntimeError, match="slots must be"):
        cpu_kernels().rotary_kv_write(qkv, rows, pool, slots[:2], *heads)
    with pytest.raises(RuntimeError, match="kv"):  # one half of the pool: no values to write
        cpu_kernels().rotary_kv_write(qkv, rows, pool[:1], slots, *heads)


def test_a_residual_of_another_shape_raises():
    x, weight = torch.randn(3, 16), torch.ones(16)
    with pytest.raises(RuntimeError, match="residual must be"):
        cpu_kernels().add_rms_norm(x, torch.randn(2, 16), weight, 1e-5, False)


def make_attention_args(block_tables: list[list[int]], kv_lens: list[int]):
    """paged_attention_short's arguments: one decode query per request, at its last position."""
    num = len(kv_lens)
    q = torch.randn(num, 1, HEADS, HEAD_DIM)
    positions = torch.tensor([[max(n - 1, 0)] for n in kv_lens])
    args = (q, make_pool(), torch.tensor(block_tables), positions, torch.tensor(kv_lens), BLOCK_SIZE)
    return args + (HEAD_DIM**-0.5, 0, 0.0)


@pytest.mark.parametrize(
    ("tables", "kv_lens", "message"),
    [
        ([[0, 1], [2, 4]], [6, 6], r"block_tables\[1, 1\] = 4 is out of range"),  # the pool has pages 0..3
        ([[0, 1], [-1, 2]], [6, 6], r"block_tables\[1, 0\] = -1 is out of range"),
        ([[0, 1], [2, 3]], [6, 9], r"kv_lens\[1\] = 9 is out of range"),  # 2 pages hold 8 keys
        ([[0, 1], [2, 3]], [6, -1], r"kv_lens\[1\] = -1 is out of range"),
        ([[0, 5], [2, 3]], [0, 6], None),  # no keys: key 0 alone is read, page 5 never
    ],
)
def test_a_page_or_length_outside_the_pool_raises(tables, kv_lens, message):
    args = make_attention_args(tables, kv_lens)
    if message is None:
        assert cpu_kernels().paged_attention_short(*args).isfinite().all()
        return
    with pytest.raises(RuntimeError, match=message):
        cpu_kernels().paged_attention_short(*args)


def test_attention_index_tensors_of_another_shape_raise():
    q, pool, tables, positions, lens, *rest = make_attention_args([[0, 1], [2, 3]], [6, 6])
    with pytest.raises(RuntimeError, match="block_tables must be"):
        cpu_kernels().paged_attention_short(q, pool, tables[:1], positions, lens, *rest)
    with pytest.raises(RuntimeError, match="query_pos must be"):
        cpu_kernels().paged_attention_short(q, pool, tables, positions[:1], lens, *rest)
    with pytest.raises(RuntimeError, match="kv_lens must be"):
        cpu_kernels().paged_attention_short(q, pool, tables, positions, lens[:1], *rest)
    with pytest.raises(RuntimeError, match="block_size must be positive"):
        cpu_kernels().paged_attention_short(q, pool, tables, positions, lens, 0, *rest[1:])


def test_the_fused_layer_refuses_a_bad_slot_before_writing():
    """``prenorm_layer`` writes K/V through rotary_kv_write and reads pages through the attention op: their
    checks stand for it."""
    hidden_size, inter = 32, 64
    gen = torch.Generator().manual_seed(1)
    weights = [
        torch.randn(shape, generator=gen) * 0.1
        for shape in [
            ((HEADS + 2 * KV_HEADS) * HEAD_DIM, hidden_size),
            (hidden_size, HEADS * HEAD_DIM),
            (2 * inter, hidden_size),
            (hidden_size, inter),
        ]
    ]
    pool = make_pool()
    before = pool.clone()
    with pytest.raises(RuntimeError, match=r"slots\[1\] = 16 is out of range"):
        cpu_kernels().prenorm_layer(
            torch.randn(2, hidden_size), None, torch.ones(hidden_size), 1e-5, torch.ones(hidden_size), 1e-5,
            [0, 0, 0, 0], [weights[0]], [weights[1]], [weights[2]], [weights[3]],
            torch.randn(2, 2, 1, HEAD_DIM), pool, torch.tensor([4, NUM_SLOTS]), HEADS, KV_HEADS, HEAD_DIM,
            torch.tensor([[1, 2]]), torch.tensor([[4, 5]]), torch.tensor([6]), BLOCK_SIZE,
            HEAD_DIM**-0.5, 0, 0.0, 0, None, None, None,
        )  # fmt: skip
    assert torch.equal(pool, before)
