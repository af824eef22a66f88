"""Scheduler: token budget, chunked prefill, batch cap, preemption, draft slots, no request dropped.

Requests are plain RequestStates built here; `simulate_step` plays the executor's part (advance
`num_computed_tokens`, append one token when a sequence completes, rewind draft slots, finish).
"""

from __future__ import annotations

import random

import pytest
from specexec.executor.engine.block_manager import BlockManager
from specexec.executor.engine.request import RequestState, RequestStatus
from specexec.executor.engine.scheduler import ScheduledRequest, Scheduler
from specexec.sampling import SamplingParams

NEW_TOKEN = 3


def request_state(request_id: str, num_prompt_tokens: int, max_tokens: int = 4) -> RequestState:
    return RequestState(
        request_id=request_id,
        token_ids=list(range(num_prompt_tokens)),
        num_prompt_tokens=num_prompt_tokens,
        sampling_params=SamplingParams(max_tokens=max_tokens),
    )


def make_scheduler(
    num_blocks: int = 64, block_size: int = 4, max_batch_size: int = 8, max_num_tokens: int = 64
):
    return Scheduler(BlockManager(num_blocks, block_size), max_batch_size, max_num_tokens)


def make_running(scheduler: Scheduler, request: RequestState, num_computed: int) -> RequestState:
    """Put a request straight into the running list, its first `num_computed` tokens in the cache."""
    scheduler.block_manager.allocate(request.request_id, num_computed)
    request.num_computed_tokens = num_computed
    request.status = RequestStatus.RUNNING
    scheduler.running.append(request)
    return request


def simulate_step(scheduler: Scheduler, draft_slots=None) -> list[ScheduledRequest]:
    batch = scheduler.schedule(draft_slots)
    for s in batch:
        r = s.request
        completes = s.completes_sequence
        r.num_computed_tokens += s.num_new_tokens
        if s.num_draft_slots:
            scheduler.block_manager.rewind(r.request_id, s.num_draft_slots)
        if completes:
            r.token_ids.append(NEW_TOKEN)
            if r.num_output_tokens >= r.sampling_params.max_tokens:
                scheduler.finish(r)
    return batch


def tokens_in(batch: list[ScheduledRequest]) -> int:
    return sum(s.num_new_tokens + s.num_draft_slots for s in batch)


def ids(requests) -> list[str]:
    return [getattr(r, "request", r).request_id for r in requests]


def test_token_budget_is_respected_with_prefills_and_decodes():
    scheduler = make_scheduler(max_num_tokens=16)
    for i, n in enumerate([10, 3, 12, 1, 7]):
        scheduler.add(request_state(f"r{i}", n))
    first = simulate_step(scheduler)
    # r0 (10) and r1 (3) fit whole, r2 gets the last 3 tokens of the budget as a first chunk
    assert [(s.request.request_id, s.num_new_tokens) for s in first] == [("r0", 10), ("r1", 3), ("r2", 3)]
    assert tokens_in(first) == 16
    for _ in range(20):
        batch = simulate_step(scheduler)
        assert tokens_in(batch) <= 16
        if not scheduler.has_unfinished():
            break
    assert not scheduler.has_unfinished()


def test_long_prompt_is_prefilled_in_chunks_across_steps():
    scheduler = make_scheduler(max_num_tokens=16)
    request = request_state("long", 40, max_tokens=2)
    scheduler.add(request)
    chunks = []
    while scheduler.has_unfinished():
        (item,) = simulate_step(scheduler)
        chunks.append((item.num_new_tokens, item.completes_sequence))
    # completes_sequence is read after the step here, so only the decode reads True
    assert [n for n, _ in chunks] == [16, 16, 8, 1]
    assert request.output_token_ids == [NEW_TOKEN, NEW_TOKEN]


def test_only_the_last_prompt_chunk_completes_the_sequence():
    scheduler = make_scheduler(max_num_tokens=16)
    request = request_state("long", 40)
    scheduler.add(request)
    flags = []
    for _ in range(3):
        batch = scheduler.schedule()
        flags.append(batch[0].completes_sequence)
        request.num_computed_tokens += batch[0].num_new_tokens
    assert flags == [False, False, True]
    assert scheduler.block_manager.num_slots["long"] == 40


def test_max_batch_size_caps_running_requests():
    scheduler = make_scheduler(max_batch_size=2)
    requests = [request_state(f"r{i}", 3, max_tokens=2 + i) for i in range(5)]
    for r in requests:
        scheduler.add(r)
    first = simulate_step(scheduler)
    assert ids(first) == ["r0", "r1"]
    assert ids(scheduler.running) == ["r0", "r1"]
    assert ids(scheduler.waiting) == ["r2", "r3", "r4"]
    while scheduler.has_unfinished():
        simulate_step(scheduler)
        assert len(scheduler.running) <= 2
    assert all(r.num_output_tokens == r.sampling_params.max_tokens for r in requests)


def test_waiting_requests_are_admitted_in_arrival_order():
    scheduler = make_scheduler(max_batch_size=1)
    for i in range(3):
        scheduler.add(request_state(f"r{i}", 2, max_tokens=1))
    order = []
    while scheduler.has_unfinished():
        order += ids(simulate_step(scheduler))
    assert order == ["r0", "r1", "r2"]


def test_newest_running_request_is_preempted_when_pages_run_out():
    scheduler = make_scheduler(num_blocks=4, block_size=4)
    old = make_running(scheduler, request_state("old", 9), 8)  # 2 full pages, 1 token to compute
    new = make_running(scheduler, request_state("new", 9), 8)  # 2 full pages, 1 token to compute
    queued = request_state("queued", 2)
    scheduler.add(queued)
    assert scheduler.block_manager.num_free_blocks == 0

    batch = scheduler.schedule()

    assert [(s.request.request_id, s.num_new_tokens) for s in batch] == [("old", 1)]
    assert ids(scheduler.running) == ["old"]
    assert ids(scheduler.waiting) == ["new", "queued"]  # the preempted request goes to the front
    assert new.status is RequestStatus.WAITING
    assert new.num_computed_tokens == 0
    assert new.num_uncomputed_tokens == 9  # all its tokens are recomputed
    assert new.metrics.num_preemptions == 1
    assert old.metrics.num_preemptions == 0
    assert "new" not in scheduler.block_manager.block_tables
    assert len(scheduler.block_manager.block_tables["old"]) == 3


def test_nobody_is_admitted_in_a_step_that_preempted():
    scheduler = make_scheduler(num_blocks=4, block_size=4)
    make_running(scheduler, request_state("old", 9), 8)
    make_running(scheduler, request_state("new", 9), 8)
    batch = scheduler.schedule()
    assert ids(batch) == ["old"]  # "new" got its pages back but is not re-admitted in the same step
    assert ids(scheduler.waiting) == ["new"]


def test_a_request_preempts_itself_when_it_is_the_newest():
    scheduler = make_scheduler(num_blocks=3, block_size=4)
    old = make_running(scheduler, request_state("old", 7), 6)  # 2 pages, room for its next token
    new = make_running(scheduler, request_state("new", 5), 4)  # 1 full page, needs another
    batch = scheduler.schedule()
    assert ids(batch) == ["old"]
    assert new.status is RequestStatus.WAITING and new.metrics.num_preemptions == 1
    assert old.status is RequestStatus.RUNNING


def test_a_requests_own_draft_slots_are_dropped_before_preempting_anyone():
    scheduler = make_scheduler(num_blocks=5, block_size=4)
    old = make_running(scheduler, request_state("old", 4), 3)  # 1 page with room for its next token
    new = make_running(scheduler, request_state("new", 5), 4)  # 1 full page, newest
    scheduler.block_manager.allocate("someone-else", 8)  # 2 pages held elsewhere: 1 free
    batch = scheduler.schedule({new: 4})  # 1 + 4 slots would need 2 new pages
    assert ids(batch) == ["old", "new"]
    assert [s.num_new_tokens for s in batch] == [1, 1]
    assert batch[1].num_draft_slots <= 3  # only what fits in the one free page
    assert all(r.metrics.num_preemptions == 0 for r in (old, new))
    assert ids(scheduler.running) == ["old", "new"]
    assert scheduler.block_manager.num_slots["new"] == 5 + batch[1].num_draft_slots


def test_draft_slots_are_dropped_before_anyone_is_preempted():
    """The older request's draft slots would take the page the newer request needs for its one real
    token: drafts are optional, so they must go before a request is preempted."""
    scheduler = make_scheduler(num_blocks=5, block_size=4)
    old = make_running(scheduler, request_state("old", 8), 7)  # 2 pages, 1 free slot in the second
    new = make_running(scheduler, request_state("new", 9), 8)  # 2 full pages
    assert scheduler.block_manager.num_free_blocks == 1
    batch = scheduler.schedule({old: 4})  # 1 + 4 slots: needs the last free page
    assert new.metrics.num_preemptions == 0, "a request was preempted to make room for draft slots"
    assert ids(batch) == ["old", "new"]
    assert [s.num_new_tokens for s in batch] == [1, 1]


def test_draft_slots_count_against_the_token_budget():
    scheduler = make_scheduler(max_num_tokens=6)
    a = make_running(scheduler, request_state("a", 5), 4)
    b = make_running(scheduler, request_state("b", 5), 4)
    batch = scheduler.schedule({a: 3, b: 3})
    assert [(s.num_new_tokens, s.num_draft_slots) for s in batch] == [(1, 3), (1, 1)]
    assert tokens_in(batch) == 6
    assert scheduler.block_manager.num_slots["a"] == 8
    assert scheduler.block_manager.num_slots["b"] == 6


def test_prefilling_requests_get_no_draft_slots():
    scheduler = make_scheduler()
    r = make_running(scheduler, request_state("r", 10), 4)
    (item,) = scheduler.schedule({r: 3})
    assert (item.num_new_tokens, item.num_draft_slots) == (6, 0)


def test_admission_keeps_a_watermark_of_free_pages_while_others_run():
    scheduler = make_scheduler(num_blocks=4, block_size=4)
    make_running(scheduler, request_state("a", 5), 4)  # 1 page, 3 free
    scheduler.add(request_state("b", 12))  # 3 pages: would leave no page for "a" to grow
    batch = scheduler.schedule()
    assert ids(batch) == ["a"]
    assert ids(scheduler.waiting) == ["b"]


def test_finish_frees_pages_of_running_and_removes_waiting_requests():
    scheduler = make_scheduler()
    r = make_running(scheduler, request_state("r", 9), 9)
    w = request_state("w", 3)
    scheduler.add(w)
    scheduler.finish(r)
    scheduler.finish(w)
    assert not scheduler.has_unfinished()
    assert r.status is w.status is RequestStatus.FINISHED
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks


def drive_random_workload(seed: int) -> list[RequestState]:
    """12 requests of random sizes through a 12-page pool with random draft slots, checking the
    scheduler's invariants after every step; returns the requests once all have finished."""
    rng = random.Random(seed)
    scheduler = make_scheduler(num_blocks=12, block_size=4, max_batch_size=4, max_num_tokens=12)
    bm = scheduler.block_manager
    requests = [request_state(f"r{i}", rng.randint(1, 20), max_tokens=rng.randint(1, 12)) for i in range(12)]
    for r in requests:
        scheduler.add(r)
    for _ in range(1000):
        if not scheduler.has_unfinished():
            break
        slots = {  # a drafter asking for slots now and then
            r: rng.choice([0, 0, 2, 5]) for r in scheduler.running if r.num_uncomputed_tokens == 1
        }
        batch = simulate_step(scheduler, slots)
        assert batch, "a step with unfinished requests scheduled nothing"
        assert tokens_in(batch) <= scheduler.max_num_tokens
        assert len(scheduler.running) <= scheduler.max_batch_size
        unfinished = [r for r in requests if not r.is_finished]
        assert sorted(ids(scheduler.running) + ids(scheduler.waiting)) == sorted(ids(unfinished))
        for r in scheduler.running:  # a running request holds exactly its computed tokens
            assert r.status is RequestStatus.RUNNING
            assert bm.num_slots[r.request_id] == r.num_computed_tokens
        for r in scheduler.waiting:
            assert r.status is RequestStatus.WAITING
            assert r.request_id not in bm.block_tables
        held = sum(len(t) for t in bm.block_tables.values())
        assert held + bm.num_free_blocks == bm.num_blocks
    assert not scheduler.has_unfinished()
    assert bm.num_free_blocks == bm.num_blocks
    return requests


@pytest.mark.parametrize("seed", range(6))
def test_no_request_is_ever_dropped_under_page_pressure(seed):
    requests = drive_random_workload(seed)
    assert all(r.is_finished for r in requests)
    assert all(r.num_output_tokens == r.sampling_params.max_tokens for r in requests)


def test_the_random_workloads_do_preempt():
    """Guard for the test above: its pool is small enough that requests really are preempted."""
    preemptions = [sum(r.metrics.num_preemptions for r in drive_random_workload(seed)) for seed in range(6)]
    assert sum(p > 0 for p in preemptions) >= 3, preemptions
