"""Greedy decoding with speculation emits exactly the tokens of greedy decoding without it.

Every drafter here is run on tiny float64 models (llama, and gemma3 for its sliding-window layers),
for one request and for eight requests of mixed prompt lengths (some repetitive, so the NGram drafter
finds matches and the target accepts some drafts). Whatever the drafter proposes (good drafts, random
ids, garbage, or an exception), the output must equal the no-speculation output token for token, and
every KV page, of the target and of a draft model, must be back in its pool after the run.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest
import torch
from capture_checks import graph_stats, replay_captured_forwards
from factories import assert_all_pages_free, drafting_config, greedy_requests
from rest_stores import token_datastore_file
from specexec.drafters.base import Drafter, DraftProposal
from specexec.drafters.draft_target import DraftTargetDrafter
from specexec.drafters.draft_target.quantized_copy import quantized_copy
from specexec.drafters.ngram import NGramDrafter
from specexec.drafters.retrieval.rest import RestDrafter, RestOptions
from specexec.drafters.retrieval.suffix import SuffixDrafter
from specexec.executor.engine.request import FinishReason
from specexec.executor.executor import Executor
from speculative_runs import (
    BATCHES,
    MAX_TOKENS,
    SELF_DRAFT_SPEC,
    make_independent_draft_model,
    num_accepted,
    num_drafted,
    reference,
    run_speculative,
)
from tiny_models import make_tiny_model

ARCHS = ("llama", "gemma3")
VOCAB = 256


# ---- test drafters ---------------------------------------------------------------------------------------


class RandomDrafter(Drafter):
    """Proposes uniformly random token ids (seeded)."""

    def __init__(self, max_draft_len: int, vocab_size: int = VOCAB, seed: int = 0) -> None:
        super().__init__(max_draft_len)
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)

    def propose(self, request, num_slots, resources) -> DraftProposal:
        return DraftProposal(
            torch.randint(0, self.vocab_size, (num_slots,), generator=self.generator).tolist()
        )


class AdversarialDrafter(Drafter):
    """Good NGram drafts mixed with garbage: ids outside the vocabulary, negative ids, non-int values,
    more tokens than slots, probs of the wrong shape or full of NaN, entries for unknown requests and
    proposals that are not DraftProposals. Cycles through these modes, one per request-step."""

    NUM_MODES = 13

    def __init__(self, max_draft_len: int, vocab_size: int = VOCAB) -> None:
        super().__init__(max_draft_len)
        self.vocab_size = vocab_size
        self.ngram = NGramDrafter(max_draft_len=max_draft_len)
        self.steps = itertools.count()
        self.modes_used: set[int] = set()

    def prepare_draft_tokens(self, scheduled_requests, resources):
        proposals = {
            s.request.request_id: self._one(s.request, s.num_draft_slots) for s in scheduled_requests
        }
        proposals["no-such-request"] = DraftProposal([1, 2, 3])
        return proposals

    def _one(self, request, num_slots):
        good = list(self.ngram.propose(request, num_slots).token_ids) or [0]
        mode = next(self.steps) % self.NUM_MODES
        self.modes_used.add(mode)
        v = self.vocab_size
        if mode == 0:
            return DraftProposal(good)
        if mode == 1:
            return DraftProposal(good[:1] + [v] + good)  # the first id past the vocabulary
        if mode == 2:
            return DraftProposal(good[:1] + [v + 10**6, 3])
        if mode == 3:
            return DraftProposal([-1] + good)
        if mode == 4:
            return DraftProposal(good[:1] + [-(10**9), 2])
        if mode == 5:
            return DraftProposal([float(t) for t in good])  # floats, even integral ones
        if mode == 6:
            return DraftProposal(good[:1] + [True, "7", None, np.int64(3), torch.tensor(4)])
        if mode == 7:
            return DraftProposal(good * 10 + list(range(40)))  # far more than the reserved slots
        if mode == 8:
            return DraftProposal(good, torch.full((len(good), v - 1), 1 / v))  # q too narrow
        if mode == 9:
            return DraftProposal(good, torch.full((v,), 1 / v))  # q not 2-d
        if mode == 10:
            return DraftProposal(good + [1], torch.full((len(good), v), 1 / v))  # q rows < drafts
        if mode == 11:
            return DraftProposal(good, torch.full((len(good), v), float("nan")))  # right shape, NaN
        return good  # not a DraftProposal at all


class FlakyNGramDrafter(NGramDrafter):
    """An NGram drafter whose ``hook`` raises on every third call."""

    def __init__(self, hook: str, max_draft_len: int = 3) -> None:
        super().__init__(max_draft_len=max_draft_len)
        self.hook = hook
        self.calls = itertools.count(1)

    def _maybe_raise(self, hook: str) -> None:
        if hook == self.hook and next(self.calls) % 3 == 0:
            raise RuntimeError(f"flaky drafter: {hook} failed")

    def prepare_draft_tokens(self, scheduled_requests, resources):
        self._maybe_raise("prepare_draft_tokens")
        return super().prepare_draft_tokens(scheduled_requests, resources)

    def num_draft_slots(self, request) -> int:
        self._maybe_raise("num_draft_slots")
        return super().num_draft_slots(request)

    def on_verified(self, request, num_accepted: int) -> None:
        self._maybe_raise("on_verified")


class BatchSpyNGramDrafter(NGramDrafter):
    """Records the running batch size and the reserved slots whenever it is asked for drafts."""

    def __init__(self, max_draft_len: int) -> None:
        super().__init__(max_draft_len=max_draft_len)
        self.executor: Executor | None = None
        self.calls: list[tuple[int, list[int]]] = []

    def prepare_draft_tokens(self, scheduled_requests, resources):
        assert self.executor is not None
        running = len(self.executor.core.scheduler.running)
        self.calls.append((running, [s.num_draft_slots for s in scheduled_requests]))
        return super().prepare_draft_tokens(scheduled_requests, resources)


# ---- NGram -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("public_pool", [True, False], ids=["public", "private"])
@pytest.mark.parametrize("max_draft_len", [3, 5])
@pytest.mark.parametrize("arch", ARCHS)
def test_ngram_drafts_keep_greedy_output_identical(arch, max_draft_len, public_pool, batch):
    spec = {"decoding_type": "NGram", "max_draft_len": max_draft_len, "is_public_pool": public_pool}
    executor, outputs = run_speculative(arch, BATCHES[batch], speculative_config=spec)
    assert num_drafted(outputs) > 0
    assert num_accepted(outputs) > 0, "no NGram draft was accepted: the test no longer exercises acceptance"
    assert max(len(o.metrics.proposed_per_position) for o in outputs) <= max_draft_len
    assert executor.speculation.stats.num_draft_tokens >= num_drafted(outputs)


@pytest.mark.parametrize("path", ["sdpa", "matmul"])
@pytest.mark.parametrize("drafter", ["ngram", "self-int8", "eagle3"])
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("arch", ARCHS)
def test_captured_forwards_keep_greedy_output_identical(arch, batch, drafter, path, tmp_path):
    """Decode/verify steps of the target and of the drafter's models replayed through the captured
    path (batch buckets, 1 + max drafts, key pages padded), with either attention kernel: the same tokens
    as the plain run without drafts, and most forwards replayed."""
    from eagle3_heads import eagle_spec, make_head_dir
    from specexec.executor.model.attention_paths import AttentionPaths

    make_head_dir(tmp_path)
    spec = {
        "ngram": {"decoding_type": "NGram", "max_draft_len": 3},
        "self-int8": SELF_DRAFT_SPEC,
        "eagle3": eagle_spec(tmp_path),
    }[drafter]

    def capture(executor):
        executor.core.runner.attention_paths = AttentionPaths.all(path)
        replay_captured_forwards(executor)

    executor, _ = run_speculative(arch, BATCHES[batch], speculative_config=spec, before_run=capture)
    stats = graph_stats(executor)
    assert len(stats) == (1 if drafter == "ngram" else 2)
    for s in stats:
        assert s.num_replays > s.num_eager, "decode steps should replay"


# ---- DraftTarget -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("arch", ARCHS)
def test_int8_self_draft_keeps_greedy_output_identical(arch, batch):
    executor, outputs = run_speculative(arch, BATCHES[batch], speculative_config=SELF_DRAFT_SPEC)
    assert isinstance(executor.speculation.drafter, DraftTargetDrafter)
    assert num_accepted(outputs) > 0, "the int8 copy of the target should agree with it most of the time"
    if batch == "batch8":
        assert num_accepted(outputs) < num_drafted(outputs), "no draft rejected: recovery not exercised"


@pytest.mark.parametrize("arch", ARCHS)
def test_sampled_drafts_option_still_drafts_greedily_for_greedy_requests(arch):
    spec = {"decoding_type": "DraftTarget", "max_draft_len": 4, "sample_drafts": True}
    executor, outputs = run_speculative(arch, BATCHES["batch8"], speculative_config=spec)
    assert executor.speculation.drafter.returns_draft_probs
    assert num_accepted(outputs) > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_cancelled_stream_frees_the_pages_of_target_and_draft_model(arch):
    _, model = make_tiny_model(arch)
    executor = Executor(model, drafting_config(speculative_config=SELF_DRAFT_SPEC))
    stream = executor.stream(greedy_requests(BATCHES["batch8"], MAX_TOKENS))
    events = [next(stream) for _ in range(20)]
    assert not any(e.finished for e in events)
    assert executor.speculation.stats.num_draft_tokens > 0
    stream.close()  # the consumer walks away mid-generation
    assert_all_pages_free(executor)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("arch", ARCHS)
def test_independent_draft_model_keeps_greedy_output_identical(arch, batch):
    # the drafter's defaults: its own pool of 16-token pages (the target's pages hold 4 tokens)
    drafter = DraftTargetDrafter(make_independent_draft_model(), 4, VOCAB)
    assert drafter.block_manager.block_size == 16
    executor, outputs = run_speculative(arch, BATCHES[batch], drafter=drafter)
    assert executor.speculation.drafter is drafter
    assert num_drafted(outputs) > 0


# ---- drafters that propose junk or fail ------------------------------------------------------------------


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("arch", ARCHS)
def test_random_drafts_keep_greedy_output_identical(arch, batch):
    executor, outputs = run_speculative(arch, BATCHES[batch], drafter=RandomDrafter(4))
    assert num_drafted(outputs) > 0
    # with 4 slots every decode step but the last few carries drafts
    assert executor.speculation.stats.num_draft_steps >= len(BATCHES[batch]) * (MAX_TOKENS - 5)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("arch", ARCHS)
def test_adversarial_drafts_are_cut_and_never_emitted(arch, batch):
    drafter = AdversarialDrafter(4)
    executor, outputs = run_speculative(arch, BATCHES[batch], drafter=drafter)
    assert drafter.modes_used == set(range(AdversarialDrafter.NUM_MODES)), "not every mode was exercised"
    for out in outputs:
        assert all(isinstance(t, int) and 0 <= t < VOCAB for t in out.token_ids)
        assert len(out.metrics.proposed_per_position) <= 4, "more drafts verified than slots reserved"
    assert num_drafted(outputs) > 0


@pytest.mark.parametrize(
    "bad_proposal",
    [
        pytest.param(lambda good: DraftProposal(None), id="token_ids-None"),
        pytest.param(lambda good: DraftProposal(5), id="token_ids-int"),
        pytest.param(lambda good: DraftProposal(good, [[0.5] * VOCAB] * len(good)), id="probs-list"),
        pytest.param(lambda good: DraftProposal(good, np.ones((len(good), VOCAB))), id="probs-ndarray"),
    ],
)
def test_malformed_proposal_objects_cost_only_the_drafts(bad_proposal):
    """A proposal whose fields have the wrong type must be dropped like one of the wrong shape, not
    crash the run (the speculation stage promises to keep only what is safe to verify)."""

    class MalformedDrafter(NGramDrafter):
        def propose(self, request, num_slots, resources=None):
            good = super().propose(request, num_slots, resources).token_ids
            return bad_proposal(good)

    run_speculative("llama", BATCHES["batch8"], drafter=MalformedDrafter(max_draft_len=3))


def test_drafter_that_raises_sometimes_costs_only_drafts_and_is_logged_once(caplog):
    drafter = FlakyNGramDrafter("prepare_draft_tokens")
    with caplog.at_level(logging.ERROR, logger="specexec"):
        executor, outputs = run_speculative(
            "llama", BATCHES["batch8"], drafter=drafter, expect_drafter_errors=True
        )
    stats = executor.speculation.stats
    assert stats.num_drafter_errors > 1
    assert num_accepted(outputs) > 0, "the calls that did not raise should still have drafted"
    errors = [r for r in caplog.records if r.name == "specexec" and r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "FlakyNGramDrafter" in errors[0].getMessage()
    assert errors[0].exc_info is not None and "prepare_draft_tokens failed" in str(errors[0].exc_info[1])


@pytest.mark.parametrize("hook", ["num_draft_slots", "on_verified"])
def test_drafter_that_raises_in_its_other_hooks_costs_only_drafts(hook, caplog):
    """The other per-step drafter hooks (slot reservation, verification feedback) may fail too."""
    drafter = FlakyNGramDrafter(hook)
    with caplog.at_level(logging.ERROR, logger="specexec"):
        executor, _ = run_speculative("llama", BATCHES["batch8"], drafter=drafter, expect_drafter_errors=True)
    assert executor.speculation.stats.num_drafter_errors > 0


# ---- page pressure and chunked prefill ---------------------------------------------------------------------


# ---- Suffix ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("max_cached_requests", [0, 1000], ids=["own-text", "shared"])
@pytest.mark.parametrize("arch", ARCHS)
def test_suffix_drafts_keep_greedy_output_identical(arch, max_cached_requests, batch):
    spec = {"decoding_type": "Suffix", "max_draft_len": 6, "max_cached_requests": max_cached_requests}
    executor, outputs = run_speculative(arch, BATCHES[batch], speculative_config=spec)
    assert num_accepted(outputs) > 0, "no Suffix draft was accepted: the test no longer exercises acceptance"
    assert max(len(o.metrics.proposed_per_position) for o in outputs) <= 6
    drafter = executor.speculation.drafter
    assert not drafter._local and not drafter._outputs, "a finished request's own index was kept"
    assert drafter.num_cached_requests() == (len(outputs) if max_cached_requests else 0)


def _draft_target_cases(kind: str, arch: str) -> Drafter | None:
    if kind == "ngram":
        return NGramDrafter(max_draft_len=4)
    if kind == "suffix":
        return SuffixDrafter(max_draft_len=4)
    if kind == "rest":  # a datastore of text like the model's own: the first halves of its answers
        answers = reference(arch, BATCHES["batch8"])
        store = token_datastore_file([a[: len(a) // 2] for a in answers])
        return RestDrafter(4, RestOptions(datastore=store))
    if kind == "int8-self-draft":
        return None  # built from speculative_config
    return DraftTargetDrafter(make_independent_draft_model(), 4, VOCAB, num_kv_blocks=128, block_size=4)


DRAFTER_KINDS = ["ngram", "suffix", "rest", "int8-self-draft", "independent-draft"]


@pytest.mark.parametrize("kind", DRAFTER_KINDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_preemption_while_drafting_keeps_greedy_output_identical(arch, kind):
    # 40 pages of 4 tokens: the 8 requests need ~96 prompt + 128 output tokens plus draft slots
    drafter = _draft_target_cases(kind, arch)
    spec = SELF_DRAFT_SPEC if drafter is None else None
    executor, outputs = run_speculative(
        arch, BATCHES["batch8"], drafter=drafter, speculative_config=spec, num_kv_blocks=40
    )
    assert sum(o.metrics.num_preemptions for o in outputs) > 0, "the small pool should force preemptions"
    assert num_drafted(outputs) > 0
    if kind != "independent-draft":
        assert num_accepted(outputs) > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_full_draft_model_pool_ends_drafting_early_without_leaks(arch):
    # 12 pages of 4 tokens for the draft model: not enough to cache all 8 requests
    draft = quantized_copy(make_tiny_model(arch)[1])
    drafter = DraftTargetDrafter(draft, 4, VOCAB, num_kv_blocks=12, block_size=4)
    _, outputs = run_speculative(arch, BATCHES["batch8"], drafter=drafter)
    assert num_accepted(outputs) > 0
    assert sum(1 for o in outputs if o.metrics.num_draft_tokens) < len(outputs), "the pool was big enough"


@pytest.mark.parametrize("kind", DRAFTER_KINDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_keeps_greedy_output_identical(arch, kind):
    # 16 tokens per forward: the 30-, 20-, 17-token prompts are prefilled in chunks
    drafter = _draft_target_cases(kind, arch)
    spec = SELF_DRAFT_SPEC if drafter is None else None
    forwards = []

    def record_target_forwards(executor):
        forward = executor.core.runner.forward
        executor.core.runner.forward = lambda seqs: forwards.append(seqs) or forward(seqs)

    _, outputs = run_speculative(
        arch,
        BATCHES["batch8"],
        drafter=drafter,
        speculative_config=spec,
        max_num_tokens=16,
        before_run=record_target_forwards,
    )
    assert all(sum(len(s.token_ids) for s in seqs) <= 16 for seqs in forwards)
    assert any(s.num_logit_rows == 0 for seqs in forwards for s in seqs), "no prompt was prefilled in chunks"
    assert num_drafted(outputs) > 0
    if kind != "independent-draft":
        assert num_accepted(outputs) > 0


# ---- draft length schedule and policy ----------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_draft_len_schedule_turns_drafting_off_for_big_batches(arch):
    spec = {"decoding_type": "NGram", "max_draft_len": 3, "draft_len_schedule": {1: 3, 4: 0}}
    # batch of 8 that all finish together: never fewer than 4 running, so never a draft
    drafter = BatchSpyNGramDrafter(3)
    _, model = make_tiny_model(arch)
    executor = Executor(model, drafting_config(speculative_config=spec), drafter=drafter)
    drafter.executor = executor
    outputs = executor.run(greedy_requests(BATCHES["batch8"], MAX_TOKENS))
    assert [o.token_ids for o in outputs] == reference(arch, BATCHES["batch8"])
    assert drafter.calls == [] and num_drafted(outputs) == 0
    assert_all_pages_free(executor)

    # staggered lengths: the batch shrinks, and drafts come back once fewer than 4 run
    max_tokens = [4, 6, 8, 10, 12, 14, 16, 24]
    drafter = BatchSpyNGramDrafter(3)
    _, model = make_tiny_model(arch)
    executor = Executor(model, drafting_config(speculative_config=spec), drafter=drafter)
    drafter.executor = executor
    outputs = executor.run(greedy_requests(BATCHES["batch8"], max_tokens))
    assert [o.token_ids for o in outputs] == reference(arch, BATCHES["batch8"], max_tokens)
    assert_all_pages_free(executor)
    assert drafter.calls, "with fewer than 4 requests running, drafting should resume"
    for running, slots in drafter.calls:
        assert running < 4 and all(1 <= n <= 3 for n in slots), (running, slots)
    assert num_drafted(outputs) > 0


@pytest.mark.parametrize("kind", ["ngram", "int8-self-draft"])
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("arch", ARCHS)
def test_acceptance_draft_len_policy_keeps_greedy_output_identical(arch, batch, kind):
    decoding_type = "NGram" if kind == "ngram" else "DraftTarget"
    spec = {"decoding_type": decoding_type, "max_draft_len": 4, "draft_len_policy": "acceptance"}
    executor, outputs = run_speculative(arch, BATCHES[batch], speculative_config=spec)
    assert executor.speculation.policy is not None
    assert num_drafted(outputs) > 0
    if kind == "int8-self-draft":
        assert num_accepted(outputs) > 0


def test_draft_slots_never_refuse_a_prompt_near_the_kv_cap():
    """A pool of 8 pages of 4 tokens caps the context at 32 tokens, drafts or not: a 28-token prompt is
    accepted with a k=4 drafter, which drafts fewer tokens near the cap, and the output is the one
    without drafts."""
    prompt = [9, 10, 11] * 9 + [9]

    class RepeatLastDrafter(Drafter):  # always wants every slot
        def propose(self, request, num_slots, resources):
            return DraftProposal([request.token_ids[-1]] * num_slots)

    drafter = RepeatLastDrafter(4)
    _, model = make_tiny_model("llama")
    executor = Executor(model, drafting_config(num_kv_blocks=8), drafter=drafter)
    assert executor.core.max_model_len == 32
    (out,) = executor.run(greedy_requests([prompt], 4))
    assert out.finish_reason is FinishReason.LENGTH, out.error
    assert [out.token_ids] == reference("llama", [prompt], 4)
    assert out.metrics.num_draft_tokens > 0
    assert_all_pages_free(executor)
