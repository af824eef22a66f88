"""``cache_salt``: requests of different salts never share prefix-cache pages (the salt starts the
page digests' chain, `block_manager.root_digest`) nor the NGram/Suffix pools shared across requests;
unsalted requests share the unsalted ones as before. Checked on the block manager, the executor over a
tiny model, the drafters' pools, and a real server (``usage.prompt_tokens_details.cached_tokens``)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import httpx
import pytest
from factories import assert_all_pages_free, drafting_config
from fake_requests import FakeRequest
from served import served, wait_until_idle
from specexec import Executor, Request, SamplingParams
from specexec.drafters.ngram import NGramDrafter
from specexec.drafters.retrieval.suffix import SuffixDrafter
from specexec.executor.engine.block_manager import ROOT_DIGEST, BlockManager, page_digest, root_digest
from specexec.executor.engine.request import MAX_CACHE_SALT_CHARS
from tiny_models import make_prompts, make_tiny_model

BS = 4  #: tokens per page in the block-manager tests
PROMPT = make_prompts(1, [30], seed=7)[0]  #: 7 full pages and a token


# ---- block manager ------------------------------------------------------------------------------------
def admit(bm: BlockManager, rid: str, tokens: list[int], salt: str | None) -> int:
    """Admit a request after its cached prefix, compute it, register its pages; the pages it shared."""
    cached = bm.cached_prefix(tokens, len(tokens) - 1, salt)
    bm.allocate(rid, len(tokens) - len(cached[0]) * BS, cached)
    bm.register(rid, tokens, len(tokens), salt)
    return len(cached[0])


def test_pages_are_shared_within_a_salt_only_and_all_come_back():
    bm = BlockManager(64, BS, enable_prefix_caching=True)
    assert admit(bm, "a1", PROMPT, "tenant-a") == 0
    assert admit(bm, "b1", PROMPT, "tenant-b") == 0  # another salt: nothing shared
    assert admit(bm, "u1", PROMPT, None) == 0  # unsalted: nothing of the salted ones either
    assert admit(bm, "a2", PROMPT, "tenant-a") == 7  # the same salt: every full page before the last token
    assert admit(bm, "u2", PROMPT, None) == 7  # unsalted requests share with each other, as before
    assert admit(bm, "b2", PROMPT + [1, 2, 3], "tenant-b") == 7
    tables = bm.block_tables
    assert tables["a2"][:7] == tables["a1"][:7] and tables["u2"][:7] == tables["u1"][:7]
    assert not set(tables["a1"]) & set(tables["b1"]) and not set(tables["a1"]) & set(tables["u1"])
    assert [bm.ref_counts[p] for p in tables["a1"][:7]] == [2] * 7
    bm.check_references()
    for rid in list(tables):
        bm.free(rid)
    bm.check_references()
    assert bm.num_free_blocks == bm.num_blocks and not bm.block_tables and not bm.num_slots
    # each namespace's pages stay cached (evictable) under its own keys; b2's eighth page too
    assert bm.num_cached_blocks == 3 * 7 + 1


def test_no_salt_keeps_the_digests_it_had():
    """The unsalted chain starts at ROOT_DIGEST, so pages registered before salts existed still match."""
    assert root_digest(None) == ROOT_DIGEST
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    admit(bm, "u", PROMPT, None)
    _, digests = bm.cached_prefix(PROMPT, len(PROMPT) - 1)
    want = [page_digest(ROOT_DIGEST, PROMPT[:BS])]
    for i in range(1, 7):
        want.append(page_digest(want[-1], PROMPT[i * BS : (i + 1) * BS]))
    assert digests == want


def test_a_salt_spelling_a_page_never_reaches_the_page_after_it():
    """A salt whose bytes are a victim's first page (as int64s) must not make the attacker's first page
    the victim's second: with SHA-256(ROOT_DIGEST + salt) it would, so the salt's digest is tagged."""
    first = [int.from_bytes(b"AAAAAAAA", "little")] * BS
    second = [5, 6, 7, 8]
    salt = array("q", first).tobytes().decode("ascii")
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    admit(bm, "victim", first + second + [9], None)
    assert root_digest(salt) != page_digest(ROOT_DIGEST, first)
    assert bm.cached_prefix(second + [9], 4, salt) == ([], [])


def test_salts_are_told_apart_by_every_character():
    salts = [
        "a",
        "b",
        "A",
        "a ",
        "tenant-1",
        "tenant-10",
        "\u00e9",
        "e\u0301",
        "\ud800",
    ]  # (a lone surrogate too)
    assert len({root_digest(s) for s in salts} | {ROOT_DIGEST}) == len(salts) + 1


# ---- executor ------------------------------------------------------------------------------------------
def caching_executor(spec=None, cache: bool = True) -> Executor:
    """The tiny llama, prefix caching on unless ``cache`` is false, drafting with ``spec`` every step."""
    _, model = make_tiny_model("llama")
    return Executor(model, drafting_config(speculative_config=spec, enable_prefix_caching=cache))


def run_one(executor: Executor, salt: str | None, prompt=PROMPT):
    (out,) = executor.run([Request(prompt, SamplingParams(max_tokens=8, ignore_eos=True), cache_salt=salt)])
    assert out.error is None, out.error
    return out


@pytest.mark.parametrize(
    "spec", [None, {"decoding_type": "Suffix", "max_draft_len": 4}], ids=["plain", "suffix"]
)
def test_cached_tokens_count_only_the_same_salts_pages_and_greedy_output_is_unchanged(spec):
    want = run_one(caching_executor(None, cache=False), None).token_ids
    executor = caching_executor(spec)
    order = ["tenant-a", "tenant-b", None, "tenant-a", None, "tenant-b"]
    outputs = [run_one(executor, salt) for salt in order]
    assert [o.metrics.num_cached_tokens for o in outputs] == [0, 0, 0, 28, 28, 28]
    assert all(o.token_ids == want for o in outputs)
    assert_all_pages_free(executor)


def test_requests_of_other_salts_do_not_wait_for_each_others_pages():
    """A request waits a step for a running one computing its next page only under the same salt: a
    wait for another tenant's identical prompt would say (by its timing) that the prompt is running."""
    executor = caching_executor()
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    executor.add_request(Request(PROMPT, params, request_id="a", cache_salt="tenant-a"))
    executor.add_request(Request(PROMPT, params, request_id="b", cache_salt="tenant-b"))
    executor.add_request(Request(PROMPT, params, request_id="a2", cache_salt="tenant-a"))
    executor.step()
    assert {r.request_id for r in executor.core.scheduler.running} == {"a", "b"}  # a2 waits for a's pages
    outputs = {}
    while executor.core.has_unfinished():
        outputs |= {e.request_id: e.output for e in executor.step() if e.finished}
    assert outputs["a2"].metrics.num_cached_tokens == 28 and outputs["b"].metrics.num_cached_tokens == 0
    assert_all_pages_free(executor)


def test_the_samples_of_a_salted_request_share_its_pages_with_each_other_only():
    executor = caching_executor()
    params = SamplingParams(max_tokens=4, ignore_eos=True, n=3)
    (sampled,) = executor.run([Request(PROMPT, params, cache_salt="tenant-a")])
    assert [s.metrics.num_cached_tokens for s in sampled.samples] == [0, 28, 28]
    assert run_one(executor, "tenant-b").metrics.num_cached_tokens == 0
    assert run_one(executor, "tenant-a").metrics.num_cached_tokens == 28
    assert_all_pages_free(executor)


@pytest.mark.parametrize("salt", ["", "x" * (MAX_CACHE_SALT_CHARS + 1), 7, b"bytes"])
def test_a_bad_salt_finishes_its_request_with_an_error_and_holds_nothing(salt):
    executor = caching_executor()
    bad, good = executor.run(
        [
            Request(PROMPT, SamplingParams(max_tokens=2), cache_salt=salt),
            Request(PROMPT, SamplingParams(max_tokens=2)),
        ]
    )
    assert bad.finish_reason == "error" and bad.is_invalid_request and "cache_salt" in bad.error
    assert good.error is None
    assert_all_pages_free(executor)


# ---- drafter pools ------------------------------------------------------------------------------------
@dataclass(eq=False)
class SaltedRequest(FakeRequest):
    cache_salt: str | None = None


def teach(drafter, salt: str | None, prompt: list[int], output: list[int]) -> None:
    """A request of ``salt`` runs (drafting as it goes) and finishes with ``output``."""
    request = SaltedRequest(f"teach-{salt}-{prompt[0]}", list(prompt), len(prompt), cache_salt=salt)
    drafter.num_draft_slots(request)
    request.token_ids += output
    drafter.num_draft_slots(request)
    request.finish_reason = "stop"
    drafter.release(request)


def drafts_for(drafter, salt: str | None, context: list[int]) -> list[int]:
    request = SaltedRequest(f"ask-{salt}-{len(context)}", list(context), len(context), cache_salt=salt)
    slots = drafter.num_draft_slots(request)
    drafts = drafter.propose(request, slots).token_ids
    drafter.release(request)
    return drafts


SECRET = [40, 41, 42, 43, 44, 45, 46, 47]  #: what the teaching tenant's request produced


@pytest.mark.parametrize(
    "make", [lambda: NGramDrafter(max_draft_len=4), lambda: SuffixDrafter(max_draft_len=4)]
)
@pytest.mark.parametrize("teacher", ["tenant-a", None])
def test_a_drafter_never_proposes_what_only_another_salt_taught_it(make, teacher):
    drafter = make()
    teach(drafter, teacher, [1, 2, 3], SECRET)
    context = [9, 9] + SECRET[:3]
    assert drafts_for(drafter, teacher, context)[:1] == [SECRET[3]]  # its own salt's requests learn from it
    for other in ("tenant-b", None, "tenant-a "):
        if other != teacher:
            assert drafts_for(drafter, other, context) == [], other


@pytest.mark.parametrize(
    "make", [lambda: NGramDrafter(max_draft_len=4), lambda: SuffixDrafter(max_draft_len=4)]
)
def test_running_requests_of_other_salts_do_not_draft_from_each_other(make):
    drafter = make()
    a = SaltedRequest("a", [1, 2], 2, cache_salt="tenant-a")
    drafter.num_draft_slots(a)
    a.token_ids += SECRET
    drafter.num_draft_slots(a)  # a is running, its output indexed
    assert drafts_for(drafter, "tenant-b", [7] + SECRET[:3]) == []
    assert drafts_for(drafter, "tenant-a", [7] + SECRET[:3])[:1] == [SECRET[3]]


def test_suffix_keeps_its_bound_across_salts_and_drops_an_emptied_salts_index():
    drafter = SuffixDrafter(max_draft_len=4, max_cached_requests=2)
    for i, salt in enumerate(["s1", "s2", "s3", None]):
        teach(drafter, salt, [1 + i], [100 + i, 101 + i, 102 + i])
    assert drafter.num_cached_requests() == 2 and set(drafter._salted) == {"s3"}
    assert drafts_for(drafter, "s1", [100, 101]) == []  # evicted with the oldest outputs
    drafter.forget_finished_requests()
    assert drafter.num_cached_requests() == 0 and not drafter._salted and len(drafter.shared) == 0


def test_ngram_salted_pools_share_one_key_bound_and_drop_the_least_recently_used_salt():
    drafter = NGramDrafter(max_draft_len=2, max_matching_ngram_size=1, max_pool_entries=12)
    teach(drafter, None, [1], list(range(200, 212)))  # the unsalted pool has a bound of its own
    for salt in ("s1", "s2", "s3"):
        teach(drafter, salt, [1], [300 + 10 * int(salt[1]) + i for i in range(6)])
    total = sum(len(pool) for pool in drafter._salted.values())
    assert total <= 12 and "s1" not in drafter._salted and {"s2", "s3"} <= set(drafter._salted)
    assert drafter.pool_size() == 12  # (the unsalted pool kept its keys)
    assert drafts_for(drafter, "s3", [9, 330]) == [331, 332]


# ---- server -------------------------------------------------------------------------------------------
SYSTEM = "You are the support agent of a company that sells garden tools. " * 4


def bodies(route: str) -> dict:
    """A request of ``route`` over a long system prompt of its own (each route's pages are its own)."""
    system = f"{route}: {SYSTEM}"
    return {
        "/v1/chat/completions": {
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hello?"}],
            "max_tokens": 4,
        },
        "/v1/completions": {"prompt": system + "Hello?", "max_tokens": 4},
        "/v1/responses": {"instructions": system, "input": "Hello?", "max_output_tokens": 4},
    }[route]


def cached_tokens(answer: dict) -> int:
    usage = answer["usage"]
    details = usage.get("prompt_tokens_details") or usage["input_tokens_details"]
    return details["cached_tokens"]


def test_a_tenant_sending_anothers_prompt_under_its_own_salt_finds_nothing_cached():
    with served() as (base, engine, stack):
        http = stack.enter_context(httpx.Client(base_url=base, timeout=60))
        for route in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):

            def ask(salt: str | None, route: str = route) -> dict:
                body = {"model": "tiny", "temperature": 0, **bodies(route)}
                if salt is not None:
                    body["cache_salt"] = salt
                answer = http.post(route, json=body)
                assert answer.status_code == 200, answer.text
                return answer.json()

            first, other, again, unsalted = ask(f"a{route}"), ask(f"b{route}"), ask(f"a{route}"), ask(None)
            assert cached_tokens(first) == 0 and cached_tokens(other) == 0, route
            assert cached_tokens(again) > 0 and cached_tokens(unsalted) == 0, route
            for bad in ("", "x" * (MAX_CACHE_SALT_CHARS + 1), 12, ["a"]):
                answer = http.post(route, json={"model": "tiny", **bodies(route), "cache_salt": bad})
                assert answer.status_code == 400, (route, bad, answer.text)
                assert answer.json()["error"]["param"] == "cache_salt", (route, bad)
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)
