"""Fault injection over the stages of `step()`: grammar compile, mask build, the drafter's slots /
proposals / release, the forward, and sampling; each fault raises, returns garbage, or (for the stages
that can be bounded: grammar compile and drafter calls) hangs past its deadline.

Each fault is injected for one *bad* request run beside three good ones. The good requests' outputs
must equal a clean run; the bad one fails alone with a message naming the cause (a drafter fault only
costs drafts, so there the bad request's output must equal its clean output too); every KV page is
free afterwards and the next call works.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from factories import assert_all_pages_free, greedy, schema_format, tiny_executor
from grammar_support import smollm2_tokenizer, tag_grammar
from specexec import Executor, ExecutorConfig, FinishReason, Request, SamplingParams
from specexec.drafters import DraftProposal
from specexec.drafters.ngram import NGramDrafter
from specexec.grammar import GrammarCompilerPool, RequestGrammar
from specexec.sampling.rejection import Verification
from tiny_models import make_tiny_model

POISON = 255  #: a token only the bad request's prompt holds (tiny vocabulary)
GOOD_PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [10, 11, 12, 13, 10, 11, 12, 13, 10], [20, 21, 22]]
BAD_PROMPT = [POISON, 4, 5, POISON, 4, 5, POISON, 4]
MAX_TOKENS = 8
DEADLINE_S = 0.2  #: drafter and grammar-compile deadlines in these tests
HANG_S = 0.6  #: a hanging call sleeps this long (past the deadline)


def deadline_executor(drafter=None) -> Executor:
    """The tiny llama drafting with ``drafter`` (NGram unless given) under the drafter deadline DEADLINE_S."""
    drafter = drafter or NGramDrafter(max_draft_len=3)
    return tiny_executor(drafter=drafter, num_kv_blocks=64, max_batch_size=16, drafter_timeout_s=DEADLINE_S)


def run_and_check(executor: Executor, good: list[Request], bad: Request, error: str | None):
    """Run good + bad; check the good outputs against a clean run, the bad one's error, the pages."""
    clean = [tiny_clean_output(executor, r) for r in good]
    outputs = executor.run([*good, bad])
    for out, want in zip(outputs, clean):
        assert (out.finish_reason, out.token_ids) == want, out.error
    if error is not None:
        assert outputs[-1].finish_reason is FinishReason.ERROR and error in outputs[-1].error, outputs[
            -1
        ].error
    assert_all_free(executor)
    again = executor.run(good)  # the next call works
    assert [(o.finish_reason, o.token_ids) for o in again] == clean
    assert_all_free(executor)
    return outputs[-1]


_CLEAN: dict = {}


def tiny_clean_output(executor: Executor, request: Request):
    """The request's output from a fresh executor of the same kind, with nothing injected."""
    key = (executor.tokenizer is not None, str(request.prompt), str(request.response_format))
    if key not in _CLEAN:
        fresh = guided_ngram_executor() if executor.tokenizer is not None else deadline_executor()
        (out,) = fresh.run([Request(request.prompt, request.sampling_params, None, request.response_format)])
        fresh.close()
        _CLEAN[key] = (out.finish_reason, out.token_ids)
    return _CLEAN[key]


def assert_all_free(executor: Executor) -> None:
    """The page check of every test, and no drafter plan left behind by a fault."""
    assert_all_pages_free(executor)
    drafter = executor.speculation.drafter
    if executor.speculation.guard.is_enabled and getattr(drafter, "stage", None) != "release":
        assert not getattr(drafter, "_planned", None)  # the drafter was told of every finished request


def plain_requests(bad_params: SamplingParams | None = None) -> tuple[list[Request], Request]:
    good = [Request(p, greedy(MAX_TOKENS)) for p in GOOD_PROMPTS]
    return good, Request(BAD_PROMPT, bad_params or greedy(MAX_TOKENS))


# ---- the drafter: a fault costs drafts, never output -------------------------------------------------
class FaultyDrafter(NGramDrafter):
    """NGram, except for requests whose tokens hold POISON at one stage: raise, garbage or hang. A
    third-party drafter: isolated on the guard's thread (a hang is cut at the deadline)."""

    runs_on_loop_thread = False

    def __init__(self, stage: str, mode: str) -> None:
        super().__init__(max_draft_len=3)
        self.stage, self.mode = stage, mode
        self.num_faults = 0

    def _faulty(self, stage: str, request) -> bool:
        if stage != self.stage or POISON not in request.token_ids:
            return False
        self.num_faults += 1
        if self.mode == "raise":
            raise RuntimeError(f"injected fault in {stage}")
        if self.mode == "hang":
            time.sleep(HANG_S)
            return False
        return True  # garbage

    def num_draft_slots(self, request) -> int:
        if self._faulty("slots", request):
            return 2.5  # type: ignore[return-value]
        return super().num_draft_slots(request)

    def propose(self, request, num_slots, resources=None):
        proposal = super().propose(request, num_slots, resources)
        if self._faulty("propose", request):
            return DraftProposal([3, 1, 4], probs=torch.full((3, 256), float("nan")))
        return proposal

    def release(self, request) -> None:
        if self._faulty("release", request):
            return None
        super().release(request)


DRAFTER_FAULTS = [
    (stage, mode)
    for stage in ("slots", "propose", "release")
    for mode in ("raise", "garbage", "hang")
    if (stage, mode) != ("release", "garbage")  # release answers nothing: there is no garbage to give
]


@pytest.mark.parametrize(("stage", "mode"), DRAFTER_FAULTS, ids=[f"{s}-{m}" for s, m in DRAFTER_FAULTS])
def test_drafter_fault_costs_only_drafts(stage, mode):
    drafter = FaultyDrafter(stage, mode)
    executor = deadline_executor(drafter)
    good, bad = plain_requests()
    bad_output = run_and_check(executor, good, bad, error=None)
    assert (bad_output.finish_reason, bad_output.token_ids) == tiny_clean_output(executor, bad)
    assert drafter.num_faults > 0
    stats = executor.speculation.stats
    counted = {
        "raise": stats.num_drafter_errors,
        "garbage": stats.num_garbage_answers,
        "hang": stats.num_drafter_late,
    }
    assert counted[mode] > 0, stats
    if mode == "hang":
        time.sleep(HANG_S)  # let the late call finish before the next test


@pytest.mark.parametrize("on_loop_thread", [False, True], ids=["isolated", "on-loop-thread"])
def test_drafter_late_three_times_in_a_row_is_switched_off(on_loop_thread):
    """Isolated, a late call is left behind at the deadline; on the loop's thread (the built-in drafters)
    it runs to its end and its answer is dropped. Either way: switched off after three."""
    drafter = FaultyDrafter("slots", "hang")
    drafter.runs_on_loop_thread = on_loop_thread
    executor = deadline_executor(drafter)
    executor.run([Request(BAD_PROMPT, SamplingParams(max_tokens=24, ignore_eos=True))])
    assert not executor.speculation.guard.is_enabled
    num_faults = drafter.num_faults
    time.sleep(HANG_S)
    good, _ = plain_requests()
    assert [(o.finish_reason, o.token_ids) for o in executor.run(good)] == [
        tiny_clean_output(executor, r) for r in good
    ]
    assert drafter.num_faults == num_faults  # never called again


# ---- the forward and sampling: the bad request fails alone --------------------------------------------
@pytest.mark.parametrize("mode", ["raise", "garbage"])
def test_forward_fault_fails_only_its_request(mode):
    executor = deadline_executor()
    runner = executor.core.runner
    forward = runner.forward

    def faulty_forward(seqs):
        poisoned = [s.block_table is executor.block_manager.block_tables.get("bad") for s in seqs]
        if mode == "raise" and any(poisoned):
            raise RuntimeError("injected: the model cannot take this input")
        out = forward(seqs)
        if mode == "garbage":
            with torch.inference_mode():
                for i, p in enumerate(poisoned):
                    if p:
                        out.logits[out.cu_logit_rows[i] : out.cu_logit_rows[i + 1]] = float("nan")
        return out

    runner.forward = faulty_forward
    good, bad = plain_requests()
    bad.request_id = "bad"
    error = "forward failed" if mode == "raise" else "logits hold NaN"
    run_and_check(executor, good, bad, error)


@pytest.mark.parametrize("mode", ["raise", "garbage"])
def test_sampling_fault_fails_only_its_request(mode):
    executor = deadline_executor()
    sampler = executor.core.verifier.sampler
    verify_batch, verify = sampler.verify_batch, sampler.verify
    poison_seed = 666

    def faulty_verify_batch(logits, meta, params, generators):
        results = verify_batch(logits, meta, params, generators)
        for i, p in enumerate(params):
            if p.seed == poison_seed:
                if mode == "raise":
                    raise RuntimeError("injected: verification broke")
                results[i] = Verification(results[i].token_ids[:-1] + [10**9], results[i].num_accepted)
        return results

    def faulty_verify(logits, drafts, probs, params, generator):
        if params.seed == poison_seed:
            raise RuntimeError("injected: verification broke")
        return verify(logits, drafts, probs, params, generator)

    sampler.verify_batch, sampler.verify = faulty_verify_batch, faulty_verify
    good, bad = plain_requests(SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, seed=poison_seed))
    error = "sampling failed" if mode == "raise" else "outside the vocabulary"
    run_and_check(executor, good, bad, error)


# ---- grammar compile and mask build: the guided bad request fails alone -------------------------------
VOCAB = 49152
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
POISON_SCHEMA = {"type": "object", "properties": {"poison": {"type": "integer"}}, "required": ["poison"]}


def guided_ngram_executor() -> Executor:
    """The tiny llama over the SmolLM2 vocabulary, compact JSON, drafting with NGram; grammars compile within 2 s."""
    _, model = make_tiny_model("llama", vocab_size=VOCAB)
    config = ExecutorConfig(
        num_kv_blocks=128,
        block_size=8,
        dtype="float64",
        device="cpu",
        guided_json_max_whitespace=0,
        grammar_compile_timeout_s=2.0,  # (a good schema compiles in ~10 ms; a loaded machine is slower)
        speculative_config={"decoding_type": "NGram", "max_draft_len": 3},
    )
    return Executor(model, config, tokenizer=smollm2_tokenizer())


def people_and_a_poisoned_request() -> tuple[list[Request], Request]:
    """Two requests for a PERSON and one unguided (the good ones), and one for POISON_SCHEMA ("bad")."""
    params = SamplingParams(max_tokens=24)
    chat = [{"role": "user", "content": "A person as JSON."}]
    good = [
        Request(chat, params, response_format=schema_format(PERSON)),
        Request(
            [{"role": "user", "content": "Another person."}], params, response_format=schema_format(PERSON)
        ),
        Request([{"role": "user", "content": "Say hi."}], SamplingParams(max_tokens=8)),
    ]
    return good, Request(chat, params, request_id="bad", response_format=schema_format(POISON_SCHEMA))


@pytest.mark.parametrize("mode", ["raise", "garbage", "hang"])
def test_grammar_compile_fault_fails_only_its_request(mode, monkeypatch):
    release = threading.Event()
    dispatch = GrammarCompilerPool._dispatch

    def faulty_dispatch(self, spec):
        if "poison" in spec.text:
            if mode == "raise":
                raise RuntimeError("injected: the compiler broke")
            if mode == "hang":
                release.wait(30)
            else:
                return object()  # garbage: not a compiled grammar
        return dispatch(self, spec)

    monkeypatch.setattr(GrammarCompilerPool, "_dispatch", faulty_dispatch)
    executor = guided_ngram_executor()
    good, bad = people_and_a_poisoned_request()
    error = {
        "raise": "the compiler broke",
        "garbage": "not a CompiledGrammar",
        "hang": "did not compile within",
    }
    try:
        run_and_check(executor, good, bad, error[mode])
    finally:
        release.set()


@pytest.mark.parametrize("mode", ["raise", "garbage"])
def test_mask_build_fault_fails_only_its_request(mode, monkeypatch):
    executor = guided_ngram_executor()
    fill_rows = RequestGrammar.fill_rows

    def faulty_fill_rows(self, bitmask, row0, drafts):
        fill = fill_rows(self, bitmask, row0, drafts)
        if getattr(self, "is_poisoned", False):
            if mode == "raise":
                raise RuntimeError("injected: the matcher broke")
            bitmask[row0 : row0 + fill.num_rows_filled] = 0  # garbage: rows that allow nothing
        return fill

    tag_grammar(executor, "bad", "is_poisoned")
    monkeypatch.setattr(RequestGrammar, "fill_rows", faulty_fill_rows)
    good, bad = people_and_a_poisoned_request()
    run_and_check(executor, good, bad, "the matcher broke" if mode == "raise" else "admits no token")
