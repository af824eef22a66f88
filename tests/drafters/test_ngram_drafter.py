"""NGramDrafter: longest match first, oldest / newest continuation, keep-one, slots, shared and private
pools, the LRU bound, incremental indexing equal to indexing from scratch, release, config errors.

Requests are minimal stand-ins with the fields the drafter reads (`request_id`, `token_ids`,
`num_prompt_tokens`, `finish_reason`); tokens are appended to them as the executor would.
"""

from __future__ import annotations

import itertools
import random

import pytest
from fake_requests import FakeRequest, fake_request
from specexec.drafters.base import DraftProposal
from specexec.drafters.ngram import NGramDrafter, NGramOptions, NGramPool
from specexec.executor.engine.scheduler import ScheduledRequest

_ids = itertools.count()


def make_scheduled(request: FakeRequest, slots: int) -> ScheduledRequest:
    return ScheduledRequest(request, num_new_tokens=1, num_draft_slots=slots)


def ngram_drafter(**options) -> NGramDrafter:
    return NGramDrafter(**options)


def ngram_drafts(drafter: NGramDrafter, request: FakeRequest, slots: int | None = None) -> list[int]:
    slots = drafter.max_draft_len if slots is None else slots
    (proposal,) = drafter.prepare_draft_tokens([make_scheduled(request, slots)], None).values()
    assert isinstance(proposal, DraftProposal) and proposal.probs is None
    return proposal.token_ids


def ngram_reference_drafts(
    tokens: list[int], max_draft_len: int, max_ngram: int, use_oldest: bool
) -> list[int]:
    """Drafts by definition: the continuation after the first (or last) earlier occurrence of the
    longest suffix that occurred before."""
    num_tokens = len(tokens)
    for n in range(min(max_ngram, num_tokens - 1), 0, -1):
        suffix = tokens[num_tokens - n :]
        starts = [c for c in range(n, num_tokens) if tokens[c - n : c] == suffix]
        if starts:
            c = starts[0] if use_oldest else starts[-1]
            return tokens[c : c + max_draft_len]
    return []


def reference_candidates(tokens: list[int], max_draft_len: int, max_ngram: int, use_oldest: bool) -> list:
    """All distinct continuations of the longest matching suffix, by first (or last, newest first)
    occurrence."""
    num_tokens = len(tokens)
    for n in range(min(max_ngram, num_tokens - 1), 0, -1):
        suffix = tokens[num_tokens - n :]
        conts = [
            tuple(tokens[c : c + max_draft_len]) for c in range(n, num_tokens) if tokens[c - n : c] == suffix
        ]
        if conts:
            if use_oldest:
                return list(dict.fromkeys(conts))
            return list(dict.fromkeys(reversed(conts)))
    return []


# ---- lookup ----------------------------------------------------------------------------------------
def test_longest_matching_key_wins_over_shorter_ones():
    # suffix (5, 6): the 1-gram (6,) first continued with 90, but the 2-gram (5, 6) with 7 8 9
    tokens = [6, 90, 91, 92, 5, 6, 7, 8, 9, 0, 5, 6]
    d = ngram_drafter(max_draft_len=3, max_matching_ngram_size=2)
    assert ngram_drafts(d, fake_request(tokens)) == [7, 8, 9]
    d1 = ngram_drafter(max_draft_len=3, max_matching_ngram_size=1)
    assert ngram_drafts(d1, fake_request(tokens)) == [90, 91, 92]


def test_falls_back_to_shorter_key_when_longer_has_no_match():
    tokens = [3, 40, 41, 42, 9, 9, 1, 2, 3]  # (1, 2, 3) and (2, 3) never occurred before; (3,) did
    assert ngram_drafts(ngram_drafter(max_matching_ngram_size=3), fake_request(tokens)) == [40, 41, 42]


def test_oldest_occurrence_continuation_by_default():
    tokens = [1, 10, 11, 12, 1, 20, 21, 22, 1]
    assert ngram_drafts(ngram_drafter(is_use_oldest=True), fake_request(tokens)) == [10, 11, 12]


def test_newest_occurrence_continuation_when_not_use_oldest():
    tokens = [1, 10, 11, 12, 1, 20, 21, 22, 1]
    assert ngram_drafts(ngram_drafter(is_use_oldest=False), fake_request(tokens)) == [20, 21, 22]


def test_newest_counts_a_repeated_continuation_as_new():
    # (1,) continued by A, then B, then A again: the newest continuation is A
    tokens = [1, 10, 11, 12, 1, 20, 21, 22, 1, 10, 11, 12, 7, 1]
    d = ngram_drafter(is_use_oldest=False)
    assert ngram_drafts(d, fake_request(tokens)) == [10, 11, 12]
    assert d.propose_candidates(fake_request(tokens)) == [(10, 11, 12), (20, 21, 22)]


def test_recent_occurrence_gives_its_still_short_continuation():
    # the only earlier 1 is two tokens from the end: its continuation so far is (5, 1)
    tokens = [7, 1, 5, 1]
    assert ngram_drafts(ngram_drafter(max_draft_len=3, max_matching_ngram_size=1), fake_request(tokens)) == [
        5,
        1,
    ]


def test_keep_all_false_keeps_one_continuation_per_key():
    tokens = [1, 10, 11, 12, 1, 20, 21, 22, 1, 30, 31, 32, 0, 1]
    oldest = ngram_drafter(is_keep_all=False, is_use_oldest=True)
    newest = ngram_drafter(is_keep_all=False, is_use_oldest=False)
    assert ngram_drafts(oldest, fake_request(tokens)) == [10, 11, 12]
    assert ngram_drafts(newest, fake_request(tokens)) == [30, 31, 32]
    assert oldest.propose_candidates(fake_request(tokens)) == [(10, 11, 12)]
    assert newest.propose_candidates(fake_request(tokens)) == [(30, 31, 32)]
    keep_all = ngram_drafter(is_keep_all=True)
    assert keep_all.propose_candidates(fake_request(tokens)) == [(10, 11, 12), (20, 21, 22), (30, 31, 32)]


def test_candidates_for_all_keys_longest_key_first():
    tokens = [2, 50, 51, 52, 1, 2, 3, 4, 5, 0, 1, 2]
    d = ngram_drafter(max_draft_len=3, max_matching_ngram_size=2)
    assert d.propose_candidates(fake_request(tokens)) == [(3, 4, 5)]
    assert d.propose_candidates(fake_request(tokens), all_keys=True) == [(3, 4, 5), (50, 51, 52)]
    assert ngram_drafter().propose_candidates(fake_request([1, 2, 3])) == []


def test_drafts_cut_to_the_requests_slots():
    tokens = [1, 10, 11, 12, 13, 14, 0, 1]
    d = ngram_drafter(max_draft_len=5)
    request = fake_request(tokens)
    assert ngram_drafts(d, request, slots=2) == [10, 11]
    assert ngram_drafts(d, request, slots=0) == []
    assert ngram_drafts(d, request, slots=5) == [10, 11, 12, 13, 14]


def test_no_match_gives_no_drafts_and_reserves_no_slots():
    d = ngram_drafter()
    for tokens in ([], [4], [1, 2, 3, 4, 5]):
        request = fake_request(tokens)
        assert d.num_draft_slots(request) == 0
        assert ngram_drafts(d, request) == []


def test_reserves_as_many_slots_as_it_will_draft():
    d = ngram_drafter(max_draft_len=4, is_public_pool=False)
    request = fake_request([1, 10, 11, 0, 1])  # continuation after the first 1 so far: 10 11 0 1
    assert d.specexec_prepare_draft_requests([request]) == {request.request_id: 4}
    request.token_ids = [7, 1, 5, 1]
    # the sequence changed: re-indexed
    assert d.specexec_prepare_draft_requests([request]) == {request.request_id: 2}
    assert ngram_drafts(d, request) == [5, 1]


# ---- pools -----------------------------------------------------------------------------------------
def test_shared_pool_lets_request_b_use_what_request_a_produced():
    d = ngram_drafter(is_public_pool=True)
    a = fake_request([100, 101])
    ngram_drafts(d, a)
    a.token_ids += [7, 8, 9, 10, 11, 12, 13]  # A's output
    ngram_drafts(d, a)
    b = fake_request([200, 7, 8])
    assert ngram_drafts(d, b) == [9, 10, 11]


def test_shared_pool_gets_a_finished_requests_last_continuations():
    d = ngram_drafter(is_public_pool=True)
    a = fake_request([100, 101, 7, 8, 9])
    ngram_drafts(d, a)
    b = fake_request([200, 8])
    assert ngram_drafts(d, b) == []  # (8,) -> (9,) is still growing in A: not shared yet
    a.finish_reason = "stop"
    d.release(a)
    assert ngram_drafts(d, b) == [9]


def test_private_pools_do_not_leak_between_requests():
    d = ngram_drafter(is_public_pool=False)
    a = fake_request([100, 7, 8, 9, 10, 11, 12])
    ngram_drafts(d, a)
    b = fake_request([200, 7, 8])
    assert ngram_drafts(d, b) == []
    assert d.pool_size(a) > 0 and d.pool_size(b) == 0


def test_release_drops_the_private_pool_and_the_indexed_length():
    d = ngram_drafter(is_public_pool=False)
    a = fake_request([1, 10, 11, 12, 1])
    assert ngram_drafts(d, a) == [10, 11, 12]
    assert d.pool_size(a) > 0
    d.release(a)
    assert d.pool_size(a) == 0
    assert not d._private and not d._indexed and not d._planned
    assert ngram_drafts(d, a) == [10, 11, 12]  # a request seen again is indexed anew


def test_lru_cap_evicts_least_recently_used_keys_and_never_exceeds_cap():
    cap = 20
    d = ngram_drafter(max_draft_len=2, max_matching_ngram_size=1, max_pool_entries=cap)
    ngram_drafts(
        d, fake_request([1000, 1001, 1002, 1003])
    )  # (1000,) -> (1001, 1002), (1001,) -> (1002, 1003)
    assert list(d._shared.entries) == [(1000,), (1001,)]
    request = fake_request([5])
    for t in range(6, 6 + 2 * cap):
        request.token_ids.append(t)
        ngram_drafts(d, request)  # one new key per token
        assert d.pool_size() <= cap
        assert ngram_drafts(d, fake_request([9, 1000])) == [1001, 1002]  # a hit keeps (1000,) in use
    assert d.pool_size() == cap
    assert (1000,) in d._shared.entries and (1001,) not in d._shared.entries  # LRU, not FIFO
    for t in range(6 + 2 * cap, 6 + 3 * cap):  # (1000,) no longer used
        request.token_ids.append(t)
        ngram_drafts(d, request)
        assert d.pool_size() <= cap
    assert (1000,) not in d._shared.entries
    assert list(d._shared.entries)[-1] == (request.token_ids[-3],)  # the newest complete continuation
    assert ngram_drafts(d, fake_request([9, 1000])) == []


def test_lru_cap_evicts_the_least_recently_used_not_the_oldest_inserted():
    d = ngram_drafter(max_draft_len=2, max_matching_ngram_size=1, max_pool_entries=3)
    ngram_drafts(d, fake_request([1, 2, 3, 4, 5, 6]))  # keys (1,) (2,) (3,) (4,): (1,) evicted
    assert list(d._shared.entries) == [(2,), (3,), (4,)]
    assert ngram_drafts(d, fake_request([9, 2])) == [3, 4]  # (2,) is now the most recently used
    ngram_drafts(d, fake_request([7, 8, 6]))  # adds (7,): evicts (3,), the least recently used
    assert list(d._shared.entries) == [(4,), (2,), (7,)]


# ---- incremental indexing --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "max_draft_len,max_ngram,keep_all,use_oldest,public",
    [
        (3, 3, True, True, True),
        (3, 3, True, False, False),
        (4, 2, False, True, True),
        (4, 2, False, False, False),
        (1, 1, True, True, False),
        (5, 4, True, False, True),
    ],
)
def test_incremental_updates_match_a_from_scratch_index(
    max_draft_len, max_ngram, keep_all, use_oldest, public
):
    rng = random.Random(max_draft_len * 100 + max_ngram * 10 + keep_all * 4 + use_oldest * 2 + public)
    options = dict(
        max_draft_len=max_draft_len,
        max_matching_ngram_size=max_ngram,
        is_keep_all=keep_all,
        is_use_oldest=use_oldest,
        is_public_pool=public,
    )
    for _ in range(4):
        incremental = ngram_drafter(**options)
        vocab = rng.randint(2, 4)
        request = fake_request([rng.randrange(vocab) for _ in range(rng.randint(0, 6))])
        for _ in range(60):
            slots = rng.randint(0, max_draft_len)
            tokens = request.token_ids
            expected = ngram_reference_drafts(tokens, max_draft_len, max_ngram, use_oldest)
            if rng.random() < 0.5:  # the executor's path: reserve slots, then propose
                assert incremental.num_draft_slots(request) == len(expected)
            got = ngram_drafts(incremental, request, slots)
            assert got == expected[:slots], tokens
            scratch = ngram_drafter(**options)
            assert ngram_drafts(scratch, fake_request(tokens), slots) == got
            if keep_all:
                expected_candidates = reference_candidates(tokens, max_draft_len, max_ngram, use_oldest)
                assert incremental.propose_candidates(request) == expected_candidates
            else:
                assert incremental.propose_candidates(request) == ([tuple(expected)] if expected else [])
            # the executor appends 1 + accepted tokens per step
            request.token_ids += [rng.randrange(vocab) for _ in range(rng.randint(1, max_draft_len + 1))]


def test_shorter_sequence_is_reindexed():
    d = ngram_drafter(is_public_pool=False, max_draft_len=2, max_matching_ngram_size=1)
    request = fake_request([1, 10, 11, 2, 20, 21, 1])
    assert ngram_drafts(d, request) == [10, 11]
    request.token_ids = [1, 30, 31, 1]  # rewound and different: the old continuations are gone
    assert ngram_drafts(d, request) == [30, 31]
    request.token_ids += [5, 2]
    assert ngram_drafts(d, request) == []


def test_updates_only_index_the_new_tokens(monkeypatch):
    d = ngram_drafter(max_draft_len=2, max_matching_ngram_size=2)
    request = fake_request(list(range(50)))
    ngram_drafts(d, request)
    adds = []
    real_add = NGramPool.add
    monkeypatch.setattr(
        NGramPool, "add", lambda pool, key, cont: (adds.append((key, cont)), real_add(pool, key, cont))
    )
    request.token_ids += [50, 51]
    ngram_drafts(d, request)
    # the continuations 50 and 51 complete: (49, 50) after (48,) and (47, 48); (50, 51) after (49,) and (48, 49)
    assert sorted(adds) == [((47, 48), (49, 50)), ((48,), (49, 50)), ((48, 49), (50, 51)), ((49,), (50, 51))]
    assert d.on_verified(request, 1) is None


# ---- config ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field,value",
    [
        ("max_draft_len", 0),
        ("max_draft_len", 33),
        ("max_draft_len", 2.0),
        ("max_matching_ngram_size", 0),
        ("max_matching_ngram_size", True),
        ("max_pool_entries", 0),
        ("is_public_pool", 1),
        ("is_keep_all", "yes"),
        ("is_use_oldest", None),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field) as info:
        NGramDrafter(**{field: value})
    assert ("True or False" in str(info.value)) == field.startswith("is_")
    assert repr(value) in str(info.value)


def test_drafter_takes_options_or_keywords():
    assert ngram_drafter(max_draft_len=5).max_draft_len == 5
    assert NGramDrafter(max_draft_len=4, is_public_pool=False).options.is_public_pool is False
    assert NGramDrafter().max_draft_len == 3
    with pytest.raises(TypeError):
        NGramDrafter(2, NGramOptions(), is_public_pool=False)
    assert NGramDrafter(2, NGramOptions(is_keep_all=False)).options.is_keep_all is False
