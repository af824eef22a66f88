"""``SamplingParams.logprobs``: the target's log-probabilities of each output token (after the request's
processing), the same with and without drafts, equal to an independent forward, and streamed."""

from __future__ import annotations

import pytest
import torch
from eagle3_heads import eagle_spec, make_head_dir
from factories import assert_all_pages_free, drafting_config
from specexec.executor.engine import logit_stages
from specexec.executor.engine.request import FinishReason, Request
from specexec.executor.executor import Executor
from specexec.sampling import SamplingParams
from specexec.sampling.logits import apply_sampling_filters
from specexec.sampling.logprobs import token_logprobs
from speculative_runs import BATCHES, SELF_DRAFT_SPEC
from tiny_models import make_tiny_model

NGRAM = {"decoding_type": "NGram", "max_draft_len": 3}
SPECS = {"ngram": NGRAM, "self-draft": SELF_DRAFT_SPEC, "eagle3": "eagle"}


def run_prompts(prompts, params: SamplingParams, spec=None, tmp_path=None, dtype="float64"):
    _, model = make_tiny_model("llama", dtype=getattr(torch, dtype))
    if spec == "eagle":
        make_head_dir(tmp_path)
        spec = eagle_spec(tmp_path)
    executor = Executor(model, drafting_config(speculative_config=spec, dtype=dtype))
    outputs = executor.run([Request(p, params) for p in prompts])
    assert_all_pages_free(executor)
    return outputs, executor


def reference_logprobs(prompt: list[int], tokens: list[int], params: SamplingParams) -> list[float]:
    """Each token's log-probability from one HF forward over the whole sequence."""
    model, _ = make_tiny_model("llama")
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]  # [T, vocab]
    if not params.is_greedy:
        n = len(tokens)
        logits = apply_sampling_filters(
            logits,
            torch.full((n,), params.temperature),
            torch.full((n,), params.top_k, dtype=torch.long),
            torch.full((n,), params.top_p),
            torch.full((n,), params.min_p),
        )
    logp = torch.log_softmax(logits.double(), dim=-1)
    return [logp[t, x].item() for t, x in enumerate(tokens)]


@pytest.mark.parametrize("spec", list(SPECS))
def test_greedy_logprobs_are_the_same_with_and_without_drafts_and_equal_a_plain_forward(tmp_path, spec):
    prompts = BATCHES["batch8"]
    params = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=3)
    plain, _ = run_prompts(prompts, params)
    drafted, executor = run_prompts(prompts, params, SPECS[spec], tmp_path)
    assert executor.speculation.stats.num_draft_tokens > 0
    for p, d, prompt in zip(plain, drafted, prompts):
        assert d.token_ids == p.token_ids and len(d.logprobs) == len(d.token_ids)
        for a, b in zip(p.logprobs, d.logprobs):
            assert a.token_id == b.token_id and [t for t, _ in a.top] == [t for t, _ in b.top]
            assert a.logprob == pytest.approx(b.logprob, abs=1e-12)
        assert [e.logprob for e in p.logprobs] == pytest.approx(
            reference_logprobs(prompt, p.token_ids, params), abs=1e-9
        )
        for entry in p.logprobs:  # the greedy token is the likeliest; alternatives in order
            assert entry.top[0] == (entry.token_id, entry.logprob)
            assert [v for _, v in entry.top] == sorted((v for _, v in entry.top), reverse=True)


def test_float32_logprobs_with_drafts_are_within_1e_4():
    prompts = BATCHES["batch8"]
    params = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=0)
    plain, _ = run_prompts(prompts, params, dtype="float32")
    drafted, _ = run_prompts(prompts, params, SELF_DRAFT_SPEC, dtype="float32")
    for p, d in zip(plain, drafted):
        assert d.token_ids == p.token_ids
        assert [e.logprob for e in d.logprobs] == pytest.approx([e.logprob for e in p.logprobs], abs=1e-4)
        assert all(e.top == [] for e in d.logprobs)


@pytest.mark.parametrize("sample_drafts", [False, True], ids=["point-mass-q", "sampled-q"])
def test_sampled_tokens_get_the_log_probability_of_the_distribution_they_came_from(sample_drafts):
    """Accepted, recovered and bonus tokens alike: each is scored by the target's filtered row (never by
    the residual distribution a recovered token is drawn from)."""
    prompts = BATCHES["batch8"]
    params = [SamplingParams(max_tokens=16, temperature=0.8, top_k=50, seed=i, logprobs=1) for i in range(8)]
    _, model = make_tiny_model("llama")
    spec = {**SELF_DRAFT_SPEC, "sample_drafts": sample_drafts}
    executor = Executor(model, drafting_config(speculative_config=spec))
    outputs = executor.run([Request(p, sp) for p, sp in zip(prompts, params)])
    num_accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    assert 0 < num_accepted < sum(o.metrics.num_draft_tokens for o in outputs), "accepted and recovered"
    for out, prompt, sp in zip(outputs, prompts, params):
        want = reference_logprobs(prompt, out.token_ids, sp)
        assert [e.logprob for e in out.logprobs] == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("spec", ["ngram", "self-draft"])
def test_logprobs_after_penalties_are_the_same_with_and_without_drafts(spec):
    """Each row's log-probabilities come after its penalties, which count the drafts before it."""
    prompts = BATCHES["batch8"]
    params = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=2, repetition_penalty=0.5)
    plain, _ = run_prompts(prompts, params)
    drafted, _ = run_prompts(prompts, params, SPECS[spec])
    assert sum(o.metrics.num_accepted_tokens for o in drafted) > 0
    unpenalized, _ = run_prompts(prompts, SamplingParams(max_tokens=12, ignore_eos=True, logprobs=2))
    assert [o.token_ids for o in plain] != [o.token_ids for o in unpenalized]
    for p, d in zip(plain, drafted):
        assert d.token_ids == p.token_ids
        for a, b in zip(p.logprobs, d.logprobs):
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            assert [a.logprob] + [v for _, v in a.top] == pytest.approx(
                [b.logprob] + [v for _, v in b.top], abs=1e-12
            )


def test_requests_of_one_step_each_get_their_own_logprobs(tmp_path):
    """Greedy and sampled requests with different numbers of alternatives (and one without) share the
    step's batched computation; each gets what it would get alone."""
    prompts = BATCHES["batch8"][:4]
    params = [
        SamplingParams(max_tokens=8, ignore_eos=True, logprobs=3),
        SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.7, top_p=0.9, seed=1, logprobs=0),
        SamplingParams(max_tokens=8, ignore_eos=True),
        SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.3, min_p=0.05, seed=2, logprobs=5),
    ]
    _, model = make_tiny_model("llama")
    executor = Executor(model, drafting_config(speculative_config=SELF_DRAFT_SPEC))
    together = executor.run([Request(p, sp) for p, sp in zip(prompts, params)])
    for prompt, sp, out in zip(prompts, params, together):
        (alone,) = executor.run([Request(prompt, sp)])
        assert out.token_ids == alone.token_ids
        if sp.logprobs is None:
            assert out.logprobs is None
            continue
        assert [len(e.top) for e in out.logprobs] == [sp.logprobs] * len(out.token_ids)
        assert [e.logprob for e in out.logprobs] == pytest.approx(
            [e.logprob for e in alone.logprobs], abs=1e-6
        )
    assert_all_pages_free(executor)


def test_a_request_whose_logprobs_fail_fails_alone(monkeypatch):
    def failing_for_top_k_7(logits, requests):
        if any(r.params.top_k == 7 for r in requests):
            raise RuntimeError("boom")
        return token_logprobs(logits, requests)

    monkeypatch.setattr(logit_stages, "token_logprobs", failing_for_top_k_7)
    _, model = make_tiny_model("llama")
    executor = Executor(model, drafting_config(speculative_config=NGRAM))
    bad, good = executor.run(
        [
            Request([1, 2, 3], SamplingParams(max_tokens=4, top_k=7, logprobs=1)),
            Request([4, 5, 6], SamplingParams(max_tokens=4, logprobs=1)),
        ]
    )
    assert bad.finish_reason is FinishReason.ERROR and "log-probabilities failed" in bad.error
    assert good.finish_reason is FinishReason.LENGTH and len(good.logprobs) == 4
    assert_all_pages_free(executor)


def test_streamed_events_carry_the_new_tokens_entries_and_no_logprobs_unless_asked():
    _, model = make_tiny_model("llama")
    executor = Executor(model, drafting_config(speculative_config=NGRAM))
    params = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=2)
    events = list(executor.stream([Request(BATCHES["batch1"][0], params)]))
    streamed = [e for ev in events for e in ev.logprobs]
    assert all(len(ev.logprobs) == len(ev.token_ids) for ev in events)
    assert streamed == events[-1].output.logprobs
    plain = executor.run([Request([1, 2, 3], SamplingParams(max_tokens=3))])[0]
    assert plain.logprobs is None
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21).validate()
