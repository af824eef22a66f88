"""BlockManager: pages handed out, grown, rewound and returned, with the pool count always right."""

from __future__ import annotations

import random

import pytest
from specexec.executor.engine.block_manager import BlockManager


def make_block_manager(num_blocks: int = 8, block_size: int = 4) -> BlockManager:
    return BlockManager(num_blocks, block_size)


def pages(bm: BlockManager, request_id: str) -> int:
    return len(bm.block_tables[request_id])


def assert_pool_consistent(bm: BlockManager) -> None:
    """Every page is either free or in exactly one block table."""
    held = [b for table in bm.block_tables.values() for b in table]
    assert sorted(held + list(bm._free)) == list(range(bm.num_blocks))
    assert set(bm._free) <= set(bm._free_order)  # every free page can still be reached in turn


def test_allocate_takes_ceil_tokens_over_block_size_pages():
    bm = make_block_manager()
    bm.allocate("a", 10)
    assert pages(bm, "a") == 3
    assert bm.num_slots["a"] == 10
    assert bm.num_free_blocks == 5
    bm.allocate("b", 4)
    assert pages(bm, "b") == 1
    bm.allocate("c", 0)
    assert pages(bm, "c") == 0
    assert set(bm.block_tables["a"]).isdisjoint(bm.block_tables["b"])
    assert_pool_consistent(bm)


def test_append_fills_the_last_page_before_taking_a_new_one():
    bm = make_block_manager()
    bm.allocate("a", 3)
    first = list(bm.block_tables["a"])
    bm.append("a", 1)  # slot 3 still in page 0
    assert bm.block_tables["a"] == first
    bm.append("a", 1)  # slot 4 needs page 1
    assert pages(bm, "a") == 2
    assert bm.block_tables["a"][0] == first[0]
    bm.append("a", 7)  # 12 slots -> 3 pages
    assert pages(bm, "a") == 3
    assert bm.num_slots["a"] == 12
    assert bm.num_free_blocks == 5
    assert_pool_consistent(bm)


def test_rewind_frees_exactly_the_pages_past_the_new_length():
    bm = make_block_manager()
    bm.allocate("a", 10)
    table = list(bm.block_tables["a"])
    assert pages(bm, "a") == 3

    bm.rewind("a", 1)  # 9 slots: still 3 pages
    assert bm.block_tables["a"] == table
    assert bm.num_free_blocks == 5

    bm.rewind("a", 2)  # 7 slots: 2 pages, the last one returned
    assert bm.block_tables["a"] == table[:2]
    assert bm.num_free_blocks == 6
    assert table[2] in bm._free

    bm.rewind("a", 7)  # 0 slots: no pages
    assert bm.block_tables["a"] == []
    assert bm.num_slots["a"] == 0
    assert bm.num_free_blocks == bm.num_blocks
    assert_pool_consistent(bm)


def test_rewind_then_append_reuses_the_kept_page():
    bm = make_block_manager()
    bm.allocate("a", 6)
    bm.rewind("a", 1)  # 5 slots, 2 pages
    bm.append("a", 3)  # 8 slots, still 2 pages
    assert pages(bm, "a") == 2
    assert bm.num_slots["a"] == 8
    assert_pool_consistent(bm)


def test_rewind_by_zero_and_rewind_of_a_page_boundary():
    bm = make_block_manager()
    bm.allocate("a", 8)
    bm.rewind("a", 0)
    assert pages(bm, "a") == 2
    bm.rewind("a", 4)  # exactly one page
    assert pages(bm, "a") == 1
    assert bm.num_slots["a"] == 4


def test_over_rewind_and_negative_rewind_raise_and_change_nothing():
    bm = make_block_manager()
    bm.allocate("a", 5)
    with pytest.raises(ValueError, match="cannot rewind 6 of 5 slots"):
        bm.rewind("a", 6)
    with pytest.raises(ValueError, match="cannot rewind -1 of 5 slots"):
        bm.rewind("a", -1)
    assert bm.num_slots["a"] == 5
    assert pages(bm, "a") == 2
    assert_pool_consistent(bm)


def test_double_allocate_raises():
    bm = make_block_manager()
    bm.allocate("a", 3)
    with pytest.raises(KeyError, match="already holds pages"):
        bm.allocate("a", 3)
    assert pages(bm, "a") == 1
    assert bm.num_free_blocks == 7


def test_out_of_pages_raises_and_can_predicates_agree():
    bm = make_block_manager(num_blocks=4, block_size=4)
    assert bm.can_allocate(16)
    assert not bm.can_allocate(17)
    bm.allocate("a", 10)  # 3 pages
    assert bm.can_append("a", 6)  # 16 slots = 4 pages
    assert not bm.can_append("a", 7)
    with pytest.raises(RuntimeError, match="out of KV pages: need 2, 1 free"):
        bm.append("a", 7)
    assert bm.num_slots["a"] == 10
    assert pages(bm, "a") == 3
    assert not bm.can_allocate(5)
    assert bm.can_allocate(4)
    assert_pool_consistent(bm)


def test_failed_allocate_leaves_no_trace():
    """A request refused for lack of pages must not look as if it held some: a later allocate of a
    size that fits has to succeed."""
    bm = make_block_manager(num_blocks=2, block_size=4)
    with pytest.raises(RuntimeError, match="out of KV pages"):
        bm.allocate("a", 9)
    assert "a" not in bm.block_tables
    assert "a" not in bm.num_slots
    bm.allocate("a", 8)
    assert pages(bm, "a") == 2


def test_free_returns_all_pages_and_is_a_no_op_for_unknown_requests():
    bm = make_block_manager()
    bm.allocate("a", 9)
    bm.allocate("b", 2)
    bm.free("a")
    assert "a" not in bm.block_tables and "a" not in bm.num_slots
    assert bm.num_free_blocks == 7
    bm.free("a")
    bm.free("never-seen")
    assert bm.num_free_blocks == 7
    bm.free("b")
    assert bm.num_free_blocks == bm.num_blocks
    assert_pool_consistent(bm)


def test_pages_freed_by_one_request_are_reused_by_another():
    bm = make_block_manager(num_blocks=3)
    bm.allocate("a", 12)
    assert not bm.can_allocate(1)
    freed = set(bm.block_tables["a"])
    bm.free("a")
    bm.allocate("b", 12)
    assert set(bm.block_tables["b"]) == freed
    assert_pool_consistent(bm)


def test_capacity_and_constructor_checks():
    assert make_block_manager(8, 4).capacity_tokens == 32
    with pytest.raises(ValueError, match="must be > 0"):
        BlockManager(0, 4)
    with pytest.raises(ValueError, match="must be > 0"):
        BlockManager(4, 0)


def consecutive(table: list[int]) -> bool:
    return table == list(range(table[0], table[0] + len(table)))


def test_a_verify_rewound_across_a_page_boundary_takes_its_next_page_back():
    """1 + 3 slots a step, the drafts rejected: each step crosses into the next page and gives it back.
    The page taken again is the one after the last, so the table stays one run of the pool (attended as
    a view, not gathered), even with other requests taking pages in between."""
    bm = make_block_manager(num_blocks=16, block_size=4)
    bm.allocate("a", 6)
    bm.allocate("b", 6)  # b holds the pages right after a's
    bm.free("b")  # ...and gives them back to the end of the pool
    for _ in range(12):
        bm.append("a", 4)  # the verify's 1 + 3 slots
        bm.rewind("a", 3)  # the 3 drafts rejected
        bm.allocate("other", 1)  # another request takes the oldest free page meanwhile
        bm.free("other")
        assert consecutive(bm.block_tables["a"]), bm.block_tables["a"]
        assert_pool_consistent(bm)
    assert bm.num_slots["a"] == 18


def test_without_a_free_following_page_the_oldest_free_page_is_taken():
    bm = make_block_manager(num_blocks=6, block_size=4)
    bm.allocate("a", 4)  # page 0
    bm.allocate("b", 4)  # page 1: a's following page is held
    bm.append("a", 1)
    assert bm.block_tables["a"] == [0, 2]
    bm.free("b")  # page 1 goes to the end of the pool: 3, 4, 5, 1
    bm.allocate("c", 4)
    assert bm.block_tables["c"] == [3]
    assert_pool_consistent(bm)


def test_pages_taken_out_of_turn_keep_the_pool_right_over_many_random_steps():
    """Random allocate / append / rewind / free against a count of the pages each request needs: no page
    is handed out twice, the free count is always right, and the order queue stays bounded."""
    rng = random.Random(0)
    bm = make_block_manager(num_blocks=12, block_size=4)
    for _ in range(5000):
        rid = f"r{rng.randrange(4)}"
        held = bm.num_slots.get(rid)
        action = rng.random()
        if held is None:
            if bm.can_allocate(n := rng.randint(1, 10)):
                bm.allocate(rid, n)
        elif action < 0.45:
            if bm.can_append(rid, n := rng.randint(1, 5)):
                bm.append(rid, n)
        elif action < 0.9:
            bm.rewind(rid, rng.randint(0, held))
        else:
            bm.free(rid)
        for r, table in bm.block_tables.items():
            assert len(table) == -(-bm.num_slots[r] // bm.block_size)
        assert_pool_consistent(bm)
        assert len(bm._free_order) <= 2 * bm.num_blocks
