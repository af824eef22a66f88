"""vLLM's ``min_tokens`` (`sampling/min_tokens.py`): the stop tokens banned on exactly the rows before
the minimum, as a hand-written greedy loop does it; lossless with drafts (greedy identity on the float64
tiny model with drafts accepted; the sampled distribution by a chi-square test); refused out of range."""

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
from specexec.server.protocol import parse_completion
from speculative_runs import BATCHES, SELF_DRAFT_SPEC, checked_greedy_tokens
from speculative_runs import MAX_TOKENS as NUM_TOKENS  # checked_greedy_tokens' length
from tiny_models import make_tiny_model

NGRAM = {"decoding_type": "NGram", "max_draft_len": 3}


def an_early_stop_token(prompts) -> int:
    """The token the plain greedy outputs emit most: as a stop token it ends them early."""
    plain = checked_greedy_tokens(prompts, stop_token_ids=[], min_tokens=0)
    ((common, _), *_) = Counter(t for tokens in plain for t in tokens).most_common()
    return common


def hand_written_loop(prompt: list[int], stop: int, min_tokens: int) -> list[int]:
    reference, _ = make_tiny_model("llama")
    ids = list(prompt)
    for step in range(NUM_TOKENS):
        with torch.no_grad():
            row = reference(torch.tensor([ids])).logits[0, -1].clone()
        if step < min_tokens:
            row[stop] = float("-inf")
        ids.append(int(row.argmax()))
        if ids[-1] == stop:
            break
    return ids[len(prompt) :]


@pytest.mark.parametrize("min_tokens", [0, 5, NUM_TOKENS])
def test_greedy_with_min_tokens_equals_a_hand_written_loop(min_tokens):
    prompt = BATCHES["batch1"][0]
    stop = an_early_stop_token([prompt])
    want = hand_written_loop(prompt, stop, min_tokens)
    if min_tokens < NUM_TOKENS:
        assert stop in want and len(want) < NUM_TOKENS  # it stops (the test would check nothing else)
    else:
        assert stop not in want and len(want) == NUM_TOKENS
    assert checked_greedy_tokens([prompt], stop_token_ids=[stop], min_tokens=min_tokens) == [want]


@pytest.mark.parametrize("drafter", ["ngram", "self-draft"])
def test_greedy_output_with_drafts_equals_without(drafter):
    prompts = BATCHES["batch8"]
    stop = an_early_stop_token(prompts)
    want = checked_greedy_tokens(prompts, stop_token_ids=[stop], min_tokens=7)
    unbounded = checked_greedy_tokens(prompts, stop_token_ids=[stop], min_tokens=0)
    assert want != unbounded  # the minimum changed something
    spec = NGRAM if drafter == "ngram" else SELF_DRAFT_SPEC
    assert checked_greedy_tokens(prompts, spec, stop_token_ids=[stop], min_tokens=7) == want


def test_the_models_eos_is_banned_unless_ignored():
    _, model = make_tiny_model("llama")
    model.generation_config.eos_token_id = [7, 11]  # (the tiny model has no tokenizer and no EOS)
    executor = Executor(model, drafting_config())
    eos = sorted(executor.core.outputs.eos_token_ids)
    assert eos == [7, 11]
    bias = {t: 100.0 for t in eos}  # EOS would be every token's pick
    held = SamplingParams(max_tokens=6, min_tokens=4, logit_bias=bias)
    ignored = SamplingParams(max_tokens=6, min_tokens=4, logit_bias=bias, ignore_eos=True)
    first, second = executor.run([Request([1, 2, 3], held), Request([1, 2, 3], ignored)])
    assert first.finish_reason is FinishReason.STOP and len(first.token_ids) == 5
    assert first.token_ids[-1] in eos and not set(first.token_ids[:4]) & set(eos)
    assert second.token_ids[0] in eos and len(second.token_ids) == 6  # not a stop token: not banned
    assert_all_pages_free(executor)


def test_sampled_distribution_with_min_tokens_and_drafts_is_the_targets():
    """Every token before the minimum: the stop token's row is the target's with it removed."""
    probs = biased_distribution({5: float("-inf")})
    _, model = make_target()
    spec = {"decoding_type": "DraftTarget", "max_draft_len": 2, "sample_drafts": True}
    executor = Executor(model, sampling_config(speculative_config=spec))
    params = [
        SamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=7_000 + i,
            ignore_eos=True,
            stop_token_ids=[5],
            min_tokens=MAX_TOKENS,
        )
        for i in range(NUM_SAMPLES)
    ]
    outputs = executor.run([Request(PROMPT, p) for p in params])
    assert executor.speculation.stats.num_draft_tokens > 0
    counts = Counter(tuple(o.token_ids) for o in outputs)
    assert not any(5 in seq for seq in counts)
    p_value, cells = chi_square_p_value(counts, probs)
    assert cells > 10 and p_value > 1e-3, (p_value, cells)


@pytest.mark.parametrize("bad", [-1, 9, 2.0, True])
def test_bad_minimums_are_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=8, min_tokens=bad).validate()


def test_the_server_takes_min_tokens_and_refuses_a_bad_one():
    parsed = parse_completion({"prompt": [1, 2, 3], "max_tokens": 8, "min_tokens": 3}, 2048)
    assert parsed.request.sampling_params.min_tokens == 3
    with pytest.raises(ValueError, match="min_tokens"):
        parse_completion({"prompt": [1, 2, 3], "max_tokens": 8, "min_tokens": 9}, 2048)
