"""Prefix caching (`executor/engine/block_manager.py`, ``enable_prefix_caching``): pages shared by
reference count, evicted least recently released first, never written by a request that shares them;
greedy outputs identical with and without it for every drafter (with drafts accepted, preemption and
chunked prefill), and a soak over shared prefixes with aborts that leaks and double-owns nothing."""

from __future__ import annotations

import functools
import random

import pytest
from eagle3_heads import eagle_spec, make_head_dir
from factories import assert_all_pages_free, drafting_config
from rest_stores import token_datastore_file
from specexec import Executor, Request, SamplingParams
from specexec.executor.engine.block_manager import BlockManager
from speculative_runs import SELF_DRAFT_SPEC
from tiny_models import make_prompts, make_tiny_model

NGRAM = {"decoding_type": "NGram", "max_draft_len": 3}
SUFFIX = {"decoding_type": "Suffix", "max_draft_len": 4}
BASE = make_prompts(1, [40], seed=3)[0]
#: five prompts over one 40-token prefix, one that is the prefix's first 20 tokens, one repetitive
PROMPTS = [BASE + make_prompts(1, [k], seed=10 + k)[0] for k in (3, 9, 1, 17, 6)] + [
    BASE[:20],
    [5, 6, 7] * 12,
]


def test_pages_are_shared_by_reference_and_evicted_oldest_first():
    bm = BlockManager(6, 4, enable_prefix_caching=True)
    tokens = list(range(100, 112))
    bm.allocate("a", 12)
    bm.register("a", tokens, 11)  # two pages full of verified tokens
    assert bm.num_cached_blocks == 2
    pages, hashes = bm.cached_prefix(tokens + [7], 12)
    assert pages == bm.block_tables["a"][:2] and len(hashes) == 2
    assert bm.cached_prefix([100, 101, 102, 999] + tokens[4:], 12) == ([], [])  # a different first page
    bm.allocate("b", 3, (pages, hashes))  # shares both, one page of its own
    assert [bm.ref_counts[p] for p in pages] == [2, 2]
    bm.rewind("b", 3)  # its own slots only: the shared pages stay
    assert [bm.ref_counts[p] for p in pages] == [2, 2]
    bm.free("a")
    assert [bm.ref_counts[p] for p in pages] == [1, 1] and bm.num_free_blocks == 4
    bm.free("b")
    assert bm.num_free_blocks == 6 and bm.num_cached_blocks == 2  # cached, held by no one, counted free
    bm.check_references()
    bm.allocate("c", 24)  # needs every page: the cached ones are evicted, the least recent first
    assert bm.num_cached_blocks == 0 and bm.cached_prefix(tokens, 12) == ([], [])
    bm.check_references()


def colliding_page(page: list[int], seed: int = 0) -> list[int]:
    """Another page of ints whose tuple has the same Python ``hash()`` as ``page``'s: CPython's tuple
    hash (xxHash's rounds) is invertible step by step, so the last int is solved for (the attack a
    second preimage on a 64-bit ``hash()`` chain costs)."""
    mask, modulus = 2**64 - 1, 2**61 - 1  # (an int's hash is its value modulo 2**61 - 1)
    prime_1, prime_2, prime_5 = 11400714785074694791, 14029467366897019727, 2870177450012600261
    target = hash(tuple(page)) & mask
    rng = random.Random(seed)
    while True:
        head = [rng.randrange(1, 2**40) for _ in page[:-1]]
        acc = prime_5
        for item in head:
            acc = (acc + (hash(item) & mask) * prime_2) & mask
            acc = (((acc << 31) | (acc >> 33)) & mask) * prime_1 & mask
        last = (target - (len(page) ^ (prime_5 ^ 3527539))) & mask
        last = last * pow(prime_1, -1, 2**64) & mask
        last = ((last >> 31) | (last << 33)) & mask  # undo the rotation
        lane = (last - acc) * pow(prime_2, -1, 2**64) & mask  # the last item's hash, as unsigned
        if lane < modulus:
            value = lane
        elif lane > 2**64 - modulus and lane != mask:  # a negative int's hash (-1 hashes as -2)
            value = lane - 2**64
        else:
            continue
        crafted = head + [value]
        if crafted != page and hash(tuple(crafted)) == hash(tuple(page)):
            return crafted


def test_a_crafted_first_page_cannot_poison_the_page_after_a_victims_cached_prefix():
    """A first page crafted to share the victim's first page's ``hash()``: with keys chained through
    ``hash()``, the attacker's second page (its K/V computed after the crafted page) was registered
    under the victim's second key and served to the victim. SHA-256 digests name the whole prefix."""
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    system, question = [11, 12, 13, 14], [21, 22, 23, 24]
    crafted = colliding_page(system)
    assert hash(tuple(crafted)) == hash(tuple(system)) and crafted != system
    bm.allocate("victim-before", 4)
    bm.register("victim-before", system, 4)  # the victim's system prompt, cached
    bm.allocate("attacker", 8)
    bm.register("attacker", crafted + question, 8)
    attackers_page = bm.block_tables["attacker"][1]
    pages, _ = bm.cached_prefix(system + question + [1], 8)
    assert pages == bm.block_tables["victim-before"][:1]  # its own system page; the question is computed
    assert attackers_page not in pages
    bm.free("victim-before")
    bm.free("attacker")
    bm.check_references()


def test_a_different_token_anywhere_before_a_page_changes_its_key():
    bm = BlockManager(8, 2, enable_prefix_caching=True)
    bm.allocate("a", 6)
    bm.register("a", [1, 2, 3, 4, 5, 6], 6)
    assert len(bm.cached_prefix([1, 2, 3, 4, 5, 6, 0], 6)[0]) == 3
    assert bm.cached_prefix([1, 9, 3, 4, 5, 6, 0], 6) == ([], [])  # the first page differs
    assert len(bm.cached_prefix([1, 2, 3, 9, 5, 6, 0], 6)[0]) == 1  # the second differs: one page


def test_a_duplicate_page_is_not_registered():
    bm = BlockManager(8, 2, enable_prefix_caching=True)
    bm.allocate("a", 2)
    bm.allocate("b", 2)  # the same tokens computed twice before either registered
    bm.register("a", [1, 2], 2)
    bm.register("b", [1, 2], 2)
    assert bm.num_cached_blocks == 1
    bm.free("a")
    bm.free("b")
    bm.check_references()


@functools.cache
def rest_spec() -> dict:
    """REST over a datastore of the first halves of the greedy answers (text like the model's own)."""
    (answers,), _ = run_rounds(None, False, rounds=1)
    store = token_datastore_file([o.token_ids[: len(o.token_ids) // 2] for o in answers])
    return {"decoding_type": "REST", "max_draft_len": 4, "datastore": store}


def run_rounds(spec=None, cache=False, rounds=2, **overrides) -> tuple[list, Executor]:
    _, model = make_tiny_model("llama")
    settings = dict(max_num_tokens=32, max_batch_size=4, enable_prefix_caching=cache)
    executor = Executor(model, drafting_config(speculative_config=spec, **{**settings, **overrides}))
    outputs = []
    for _ in range(rounds):  # the second round finds the first's prompts and outputs cached
        outputs.append(
            executor.run([Request(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in PROMPTS])
        )
    assert all(o.error is None for round_ in outputs for o in round_)
    assert_all_pages_free(executor)
    return outputs, executor


@pytest.mark.parametrize("drafter", ["none", "ngram", "suffix", "rest", "self-draft"])
@pytest.mark.parametrize("setting", ["plain", "preemption"])
def test_greedy_outputs_are_the_same_with_and_without_the_cache(drafter, setting):
    if drafter == "rest":
        spec = rest_spec()
    else:
        spec = {"none": None, "ngram": NGRAM, "suffix": SUFFIX, "self-draft": SELF_DRAFT_SPEC}[drafter]
    overrides = {"num_kv_blocks": 22} if setting == "preemption" else {}
    want, _ = run_rounds(spec, False, **overrides)
    got, executor = run_rounds(spec, True, **overrides)
    assert [[o.token_ids for o in r] for r in got] == [[o.token_ids for o in r] for r in want]
    cached = [o.metrics.num_cached_tokens for r in got for o in r]
    assert sum(cached) > 0 and all(c % 4 == 0 for c in cached)
    assert max(o.metrics.num_cached_tokens for o in got[1]) >= 40  # the second round reuses whole prompts
    if spec is not None:
        assert sum(o.metrics.num_accepted_tokens for r in got for o in r) > 0
    if setting == "preemption":
        assert sum(o.metrics.num_preemptions for r in got for o in r) > 0


def test_eagle3_and_prompt_scoring_reuse_nothing_and_keep_their_outputs(tmp_path):
    make_head_dir(tmp_path)
    want, _ = run_rounds(eagle_spec(tmp_path), False)
    got, _ = run_rounds(eagle_spec(tmp_path), True)
    assert [[o.token_ids for o in r] for r in got] == [[o.token_ids for o in r] for r in want]
    assert all(o.metrics.num_cached_tokens == 0 for r in got for o in r)
    _, model = make_tiny_model("llama")
    executor = Executor(model, drafting_config(enable_prefix_caching=True))
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    executor.run([Request(BASE, params)])
    (scored,) = executor.run(
        [Request(BASE, SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=0))]
    )
    assert scored.metrics.num_cached_tokens == 0 and len(scored.prompt_logprobs) == len(BASE)
    assert_all_pages_free(executor)


def test_a_soak_over_shared_prefixes_with_aborts_and_preemption_leaks_nothing():
    """300 requests over a few shared prefixes, NGram drafts, a small pool (preemption), a random abort
    every few steps: after every step each page's reference count equals its holders, and at the end
    every page is free or cached."""
    _, model = make_tiny_model("llama")
    config = drafting_config(
        speculative_config=NGRAM,
        enable_prefix_caching=True,
        num_kv_blocks=16,
        max_num_tokens=48,
        max_batch_size=6,
    )
    executor = Executor(model, config)
    rng = random.Random(0)
    prefixes = [make_prompts(1, [n], seed=50 + n)[0] for n in (8, 13, 24)]
    submitted, done, step, aborted, preempted, reused = 0, set(), 0, 0, 0, 0
    while submitted < 300 or executor.core.has_unfinished():
        while submitted < 300 and submitted - len(done) < 10:
            prompt = rng.choice(prefixes)[: rng.randint(4, 24)] + [
                rng.randrange(256) for _ in range(rng.randint(0, 6))
            ]
            params = SamplingParams(max_tokens=rng.randint(1, 24), ignore_eos=True)
            executor.add_request(Request(prompt, params, request_id=f"s{submitted}"))
            submitted += 1
        for e in executor.step():
            if e.finished:
                done.add(e.request_id)
                preempted += e.output.metrics.num_preemptions
                reused += e.output.metrics.num_cached_tokens
        step += 1
        running = executor.core.scheduler.running
        if step % 7 == 0 and running:
            victim = rng.choice(running).request_id
            aborted += executor.abort_request(victim)
            done.add(victim)
        executor.block_manager.check_references()
    assert len(done) == 300 and aborted > 10 and preempted > 0 and reused > 0
    assert_all_pages_free(executor)
    assert executor.block_manager.num_cached_blocks > 0


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_n_samples_and_concurrent_requests_share_their_prompt_pages(drafter):
    """Requests submitted together over one prompt: the first computes its pages and the others wait
    a step to share them (n samples, and separate requests alike); greedy tokens as without the cache,
    and a prompt that is computed by no one ahead is admitted at once."""
    spec = NGRAM if drafter == "ngram" else None
    _, model = make_tiny_model("llama")
    outputs = {}
    for cache in (False, True):
        executor = Executor(model, drafting_config(speculative_config=spec, enable_prefix_caching=cache))
        params = SamplingParams(max_tokens=8, ignore_eos=True, n=4)
        (sampled,) = executor.run([Request(PROMPTS[0], params)])
        separate = executor.run([Request(PROMPTS[1], SamplingParams(max_tokens=8, ignore_eos=True))] * 3)
        outputs[cache] = [[s.token_ids for s in sampled.samples], [o.token_ids for o in separate]]
        assert_all_pages_free(executor)
        if cache:
            full = len(PROMPTS[0]) // 4 * 4
            assert [s.metrics.num_cached_tokens for s in sampled.samples] == [0] + [full] * 3
            # the first of the separate requests finds BASE's pages registered by the samples
            assert all(o.metrics.num_cached_tokens >= 40 for o in separate)
            assert separate[0].metrics.time_to_first_token <= separate[1].metrics.time_to_first_token
    assert outputs[True] == outputs[False]
