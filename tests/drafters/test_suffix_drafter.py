"""Suffix decoding (`drafters/retrieval/`): the index's speculation against its definition, its bounds
(places read per lookup, removal), and the drafter's own and shared indexes, eviction, guided cuts and
options.

Requests are NGram's tests' minimal stand-ins (`FakeRequest`); tokens are appended to them as the
executor would.
"""

from __future__ import annotations

import random

import pytest
from fake_requests import FakeRequest, fake_request
from specexec.drafters.retrieval.suffix import SuffixDrafter
from specexec.drafters.retrieval.suffix_index import SpeculationLimits, SuffixIndex
from specexec.executor.config import ExecutorConfig
from specexec.executor.executor import Executor
from tiny_models import make_tiny_model

#: vLLM's default limits: a draft per matched token (the tests below count drafts by them)
PER_MATCHED_TOKEN = {"max_spec_factor": 1.0, "max_spec_offset": 0.0}


def suffix_drafts(drafter: SuffixDrafter, request: FakeRequest) -> list[int]:
    slots = drafter.num_draft_slots(request)
    proposal = drafter.propose(request, slots)
    assert len(proposal.token_ids) == slots, "the slots reserved are the drafts proposed"
    return proposal.token_ids


# ---- the index against its definition ----------------------------------------------------------------------


def reference_speculation(sequences, context, num_slots, limits: SpeculationLimits):
    """By definition: the longest context suffix (at most max_depth) that occurred with a token after it;
    from all its occurrences, the most frequent next token (a tie: the oldest occurrence's) while the
    product of count / occurrences stays at least min_token_prob, within factor * match + offset."""
    places = [(s, e) for s in sequences for e in range(len(s))]  # e: the token after the occurrence
    for length in range(min(limits.max_depth, len(context)), 0, -1):
        node = [(s, e) for s, e in places if e >= length and s[e - length : e] == context[-length:]]
        if node:
            break
    else:
        return [], 0
    budget = limits.draft_budget(length, num_slots)
    out, chance = [], 1.0
    while node and len(out) < budget:
        nexts = [s[e] for s, e in node if e < len(s)]
        if not nexts:
            break
        token = max(set(nexts), key=lambda t: (nexts.count(t), -nexts.index(t)))
        chance *= nexts.count(token) / len(node)
        if chance < limits.min_token_prob:
            break
        out.append(token)
        node = [(s, e + 1) for s, e in node if e < len(s) and s[e] == token]
    return out, length


@pytest.mark.parametrize("seed", range(12))
def test_speculation_equals_its_definition(seed):
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 5])
    sequences = [
        [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))] for _ in range(rng.randrange(1, 4))
    ]
    limits = SpeculationLimits(
        max_depth=rng.choice([3, 8, 24]),
        max_spec_factor=rng.choice([0.5, 1.0, 2.0]),
        max_spec_offset=rng.choice([-1.0, 0.0, 2.0]),
        min_token_prob=rng.choice([0.0, 0.1, 0.4]),
        max_occurrences=10_000,
    )
    index = SuffixIndex()
    for s in sequences:
        index.add(s)
    for _ in range(20):
        context = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        found = index.speculate(context, 8, limits)
        want, match_len = reference_speculation(sequences, context, 8, limits)
        assert (found.token_ids, found.match_len) == (want, match_len), (context, limits)
        assert all(a >= b for a, b in zip(found.probs, found.probs[1:])), "cumulative chances only fall"


def test_growing_sequence_indexed_as_it_grows_equals_indexed_at_once():
    rng = random.Random(7)
    tokens = [rng.randrange(4) for _ in range(80)]
    grown, growing = SuffixIndex(), []
    seq_id = grown.add(growing)
    for t in tokens:
        growing.append(t)
        grown.extend(seq_id)
    at_once = SuffixIndex()
    at_once.add(tokens)
    assert grown.entries == at_once.entries and grown.num_entries == at_once.num_entries


def test_a_long_match_earns_a_long_chain_and_a_short_one_a_short_chain():
    text = list(range(100, 140))
    index = SuffixIndex()
    index.add(text)
    limits = SpeculationLimits(max_spec_factor=1.0, max_spec_offset=0.0)  # vLLM's: a draft per matched token
    long = index.speculate([7, *text[:20]], 32, limits)
    assert long.match_len == 20 and long.token_ids == text[20:40]
    short = index.speculate([7, text[5]], 32, limits)
    assert short.match_len == 1 and short.token_ids == [text[6]]
    assert index.speculate([7, text[5]], 32, SpeculationLimits()).token_ids == text[6:9]  # 2 * 1 + 1
    assert index.speculate([7, 8], 32, limits).token_ids == []


def test_a_key_seen_often_reads_only_its_most_recent_places():
    index = SuffixIndex()
    index.add([5, 1] * 50 + [5, 2] * 3)  # 5 is followed by 1 fifty times, then by 2 three times
    everything = index.speculate([5], 1, SpeculationLimits(max_spec_offset=1.0, max_occurrences=10_000))
    recent = index.speculate([5], 1, SpeculationLimits(max_spec_offset=1.0, max_occurrences=4))
    assert everything.token_ids == [1] and recent.token_ids == [2]


def test_removed_sequences_stop_matching_and_the_index_shrinks_back():
    rng = random.Random(3)
    sequences = [[rng.randrange(6) for _ in range(40)] for _ in range(10)]
    index = SuffixIndex()
    ids = [index.add(s) for s in sequences]
    for seq_id in ids[:8]:
        index.remove(seq_id)
    kept = SuffixIndex()
    for s in sequences[8:]:
        kept.add(s)
    assert index.num_entries - index.num_dead == kept.num_entries
    assert index.num_entries <= 2 * kept.num_entries, "dead places were never dropped"
    limits = SpeculationLimits(max_occurrences=10_000)
    for _ in range(30):
        context = [rng.randrange(6) for _ in range(12)]
        assert index.speculate(context, 8, limits) == kept.speculate(context, 8, limits)


# ---- the drafter -------------------------------------------------------------------------------------------


def test_drafts_from_the_requests_own_prompt_and_output():
    drafter = SuffixDrafter(max_draft_len=8, max_cached_requests=0, **PER_MATCHED_TOKEN)
    request = fake_request([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
    assert suffix_drafts(drafter, request) == [4, 5, 6]  # a 3-token match earns 3 suffix_drafts
    request.token_ids += [4, 5, 6, 7]
    assert suffix_drafts(drafter, request) == [8, 9, 1, 2, 3, 4, 5]  # 7 matched: 7 more
    assert drafter.num_cached_requests() == 0 and len(drafter.shared) == 0


def test_a_finished_requests_output_drafts_for_later_requests():
    drafter = SuffixDrafter(max_draft_len=8, **PER_MATCHED_TOKEN)
    first = fake_request([1, 2])
    suffix_drafts(drafter, first)
    first.token_ids += [30, 31, 32, 33, 34, 35, 36, 37]  # its output
    first.finish_reason = "stop"
    drafter.release(first)
    second = fake_request([9, 30, 31, 32])
    assert suffix_drafts(drafter, second) == [33, 34, 35]
    assert drafter.num_cached_requests() == 1


def test_running_requests_draft_from_each_others_outputs():
    drafter = SuffixDrafter(max_draft_len=8)
    a, b = fake_request([1]), fake_request([2])
    suffix_drafts(drafter, a), suffix_drafts(drafter, b)
    a.token_ids += [40, 41, 42, 43, 44, 45]
    suffix_drafts(drafter, a)
    b.token_ids += [40, 41, 42]
    assert suffix_drafts(drafter, b) == [43, 44, 45]


def test_failed_or_preempted_requests_leave_nothing_and_the_store_keeps_its_bound():
    drafter = SuffixDrafter(max_draft_len=8, max_cached_requests=3)
    for i in range(6):
        request = fake_request([1, 100 + i, 101 + i, 102 + i])
        suffix_drafts(drafter, request)
        request.token_ids += [200 + i, 201 + i]
        request.finish_reason = "stop"
        drafter.release(request)
    assert drafter.num_cached_requests() == 3 and len(drafter.shared) == 3
    for reason in ("error", None):  # failed, or preempted (released before it finished)
        request = fake_request([5, 6])
        suffix_drafts(drafter, request)
        request.token_ids += [7, 8]
        request.finish_reason = reason
        drafter.release(request)
    assert drafter.num_cached_requests() == 3 and len(drafter.shared) == 3
    assert not drafter._local and not drafter._outputs
    assert suffix_drafts(drafter, fake_request([9, 200 + 5])) == [201 + 5]  # the newest are kept
    assert suffix_drafts(drafter, fake_request([9, 200 + 0])) == []  # the oldest evicted


def test_forgetting_finished_requests_keeps_the_running_ones():
    """What a benchmark's run asks before it starts (the same prompts' outputs of an earlier pass)."""
    drafter = SuffixDrafter(max_draft_len=8)
    finished = fake_request([1, 100, 101, 102])
    suffix_drafts(drafter, finished)
    finished.token_ids += [200, 201]
    finished.finish_reason = "stop"
    drafter.release(finished)
    running = fake_request([3, 300, 301])
    suffix_drafts(drafter, running)
    drafter.forget_finished_requests()
    assert drafter.num_cached_requests() == 0 and len(drafter.shared) == 1
    assert suffix_drafts(drafter, fake_request([9, 200])) == []


def test_a_sequence_that_got_shorter_is_indexed_again():
    drafter = SuffixDrafter(max_draft_len=8, max_cached_requests=0, **PER_MATCHED_TOKEN)
    request = fake_request([1, 2, 3, 1, 2, 3, 1, 2])
    assert suffix_drafts(drafter, request) == [3, 1, 2]  # 5 matched; the text ends 3 tokens on
    request.token_ids = [7, 8, 9, 7, 8]
    assert suffix_drafts(drafter, request) == [9, 7]


def test_a_new_token_list_is_indexed_again():
    drafter = SuffixDrafter(max_draft_len=8, max_cached_requests=0, **PER_MATCHED_TOKEN)
    request = fake_request([1, 2, 3, 4, 1, 2])
    assert suffix_drafts(drafter, request) == [3, 4]
    request.token_ids = [5, 6, 7, 8, 5, 6, 7]  # another list, longer: the old one's index must go
    assert suffix_drafts(drafter, request) == [8, 5, 6]


class PrefixGrammar:
    """Accepts tokens below ``limit`` only (the stand-in for a request's grammar snapshot)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def fork_for_drafting(self):
        return self

    def is_terminated(self) -> bool:
        return False

    def accept_token(self, token: int) -> bool:
        return token < self.limit


def test_a_guided_requests_chain_is_cut_at_its_first_refused_token():
    drafter = SuffixDrafter(max_draft_len=8, max_cached_requests=0, **PER_MATCHED_TOKEN)
    request = fake_request([1, 2, 3, 4, 50, 6, 7, 1, 2, 3, 4])
    request.drafting_grammar = PrefixGrammar(limit=40)
    assert suffix_drafts(drafter, request) == []  # the first draft, 50, is refused
    request.drafting_grammar = PrefixGrammar(limit=60)
    assert suffix_drafts(drafter, request) == [50, 6, 7, 1]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_draft_len", 0),
        ("max_tree_depth", 0),
        ("max_cached_requests", -1),
        ("max_cached_requests", 1.5),
        ("max_spec_factor", float("nan")),
        ("min_token_prob", 1.5),
        ("max_occurrences", True),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SuffixDrafter(**{field: value})


def test_yaml_keys_reach_the_drafter_and_unknown_ones_are_refused():
    _, model = make_tiny_model("llama")

    def executor(spec):
        return Executor(model, ExecutorConfig(dtype="float64", device="cpu", speculative_config=spec))

    spec = {"decoding_type": "Suffix", "max_draft_len": 12, "max_tree_depth": 16, "min_token_prob": 0.2}
    drafter = executor(spec).speculation.drafter
    assert isinstance(drafter, SuffixDrafter)
    assert (drafter.max_draft_len, drafter.limits.max_depth, drafter.limits.min_token_prob) == (12, 16, 0.2)
    with pytest.raises(ValueError, match="unknown Suffix option") as info:
        executor({"decoding_type": "Suffix", "suffix_decoding_max_tree_depth": 16})
    assert "max_tree_depth" in str(info.value)
    with pytest.raises(ValueError, match="max_spec_factor"):
        executor({"decoding_type": "Suffix", "max_spec_factor": -1})
