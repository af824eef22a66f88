"""OpenAI's ``logit_bias`` (`sampling/logit_bias.py`): exact against a hand-written greedy loop, lossless
with drafts (greedy identity on the float64 tiny model with drafts accepted; the sampled distribution
at temperature 1 by a chi-square test), and refused where it names what is not a token."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from factories import assert_all_pages_free, drafting_config
from sampled_distribution import (
    MAX_TOKENS,
    NUM_SAMPLES,
    PROMPT,
    biased_distribution,
    chi_square_p_value,
    make_target,
    sampling_config,
)
from specexec.executor.engine.request import FinishReason, Request
from specexec.executor.executor import Executor
from specexec.sampling import SamplingParams
from speculative_runs import BATCHES, SELF_DRAFT_SPEC, checked_greedy_tokens
from speculative_runs import MAX_TOKENS as NUM_TOKENS  # checked_greedy_tokens' length
from tiny_models import make_tiny_model

NGRAM = {"decoding_type": "NGram", "max_draft_len": 3}


def a_bias_that_changes_the_output(prompts) -> dict[int, float]:
    """Ban the token the unbiased output emits most, nudge another up."""
    plain = checked_greedy_tokens(prompts, logit_bias={})
    (common, _), (second, _), *_ = Counter(t for tokens in plain for t in tokens).most_common()
    bias = {common: -100.0, second: 2.5}
    assert checked_greedy_tokens(prompts, logit_bias=bias) != plain, (
        "the bias changed nothing: the test would check nothing"
    )
    return bias


@pytest.mark.parametrize("drafter", ["ngram", "self-draft"])
@pytest.mark.parametrize("batch", ["batch1", "batch8"])
def test_greedy_output_with_drafts_equals_without(drafter, batch):
    prompts = BATCHES[batch]
    bias = a_bias_that_changes_the_output(prompts)
    want = checked_greedy_tokens(prompts, logit_bias=bias)
    spec = NGRAM if drafter == "ngram" else SELF_DRAFT_SPEC
    assert checked_greedy_tokens(prompts, spec, logit_bias=bias) == want


def test_greedy_with_a_bias_equals_a_hand_written_loop():
    reference, model = make_tiny_model("llama")
    prompt = BATCHES["batch1"][0]
    bias = a_bias_that_changes_the_output([prompt])
    ids = list(prompt)
    for _ in range(NUM_TOKENS):
        with torch.no_grad():
            row = reference(torch.tensor([ids])).logits[0, -1].clone()
        for token, add in bias.items():
            row[token] += add
        ids.append(int(row.argmax()))
    assert checked_greedy_tokens([prompt], logit_bias=bias) == [ids[len(prompt) :]]


def test_sampled_distribution_with_a_bias_and_drafts_is_the_targets():
    bias = {1: 1.5, 3: -2.0, 5: -100.0}
    probs = biased_distribution(bias)
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-9)
    _, model = make_target()
    spec = {"decoding_type": "DraftTarget", "max_draft_len": 2, "sample_drafts": True}
    executor = Executor(model, sampling_config(speculative_config=spec))
    params = [
        SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=9_000 + i, logit_bias=bias)
        for i in range(NUM_SAMPLES)
    ]
    outputs = executor.run([Request(PROMPT, p) for p in params])
    assert executor.speculation.stats.num_draft_tokens > 0
    counts = Counter(tuple(o.token_ids) for o in outputs)
    assert not any(5 in seq for seq in counts)  # -100 all but bans it
    p_value, cells = chi_square_p_value(counts, probs)
    assert cells > 10 and p_value > 1e-3, (p_value, cells)
    assert chi_square_p_value(counts, biased_distribution({}))[0] < 1e-6  # the test can tell the bias apart


@pytest.mark.parametrize("bad", [{-1: 1.0}, {3: 101}, {3: float("nan")}, {"3": 1.0}, {3: True}])
def test_bad_biases_are_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bad).validate()


def test_a_bias_outside_the_vocabulary_fails_only_its_request():
    _, model = make_tiny_model("llama")
    executor = Executor(model, drafting_config())
    outside = Request([1, 2, 3], SamplingParams(max_tokens=4, logit_bias={10**6: 1.0}))
    fine = Request([1, 2, 3], SamplingParams(max_tokens=4, logit_bias={7: 1.0}))
    bad, good = executor.run([outside, fine])
    assert bad.finish_reason is FinishReason.ERROR and "logit_bias" in bad.error
    assert good.error is None and len(good.token_ids) == 4
    assert_all_pages_free(executor)
