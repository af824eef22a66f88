"""Repetition, frequency and presence penalties: exact against independent references, and lossless
with drafts (greedy identity for every drafter kind on the float64 tiny model; the sampled distribution
at temperature 1 by a chi-square test)."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
from specexec.executor.executor import Executor
from specexec.executor.request import Request
from specexec.sampling import SamplingParams
from specexec.sampling.penalties import output_counts
from test_eagle3 import eagle_spec, make_head_dir
from test_speculative_distribution import (
    MAX_TOKENS,
    NUM_SAMPLES,
    PROMPT,
    VOCAB,
    chi_square_p_value,
    make_target,
)
from test_speculative_distribution import make_config as make_distribution_config
from test_speculative_identity import BATCHES, SELF_DRAFT_SPEC, assert_all_pages_free, make_config
from tiny_models import make_tiny_model

PENALTIES = {
    "repetition": {"repetition_penalty": 3.0},
    "frequency": {"frequency_penalty": 2.0},
    "presence": {"presence_penalty": 2.0},
    "all": {"repetition_penalty": 1.5, "frequency_penalty": 0.5, "presence_penalty": 1.0},
}
NGRAM = {"decoding_type": "NGram", "max_draft_len": 3}
NUM_TOKENS = 16


def greedy(prompts, penalties: dict, spec=None, tmp_path=None) -> tuple[list[list[int]], Executor]:
    _, model = make_tiny_model("llama")
    if spec == "eagle":
        make_head_dir(tmp_path)
        spec = eagle_spec(tmp_path)
    executor = Executor(model, make_config(speculative_config=spec))
    params = SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True, **penalties)
    outputs = executor.run([Request(p, params) for p in prompts])
    assert_all_pages_free(executor)
    return [o.token_ids for o in outputs], executor


@pytest.mark.parametrize("batch", ["batch1", "batch8"])
@pytest.mark.parametrize("spec", [NGRAM, SELF_DRAFT_SPEC, "eagle"], ids=["ngram", "self-draft", "eagle3"])
@pytest.mark.parametrize("penalty", list(PENALTIES))
def test_greedy_output_with_drafts_equals_without(tmp_path, penalty, spec, batch):
    prompts = BATCHES[batch]
    want, _ = greedy(prompts, PENALTIES[penalty])
    unpenalized, _ = greedy(prompts, {})
    assert want != unpenalized, "the penalty changed nothing: the test would check nothing"
    got, executor = greedy(prompts, PENALTIES[penalty], spec, tmp_path)
    assert got == want
    if spec is not NGRAM:  # (a penalized output rarely repeats an n-gram of its context: NGram may not draft)
        assert executor.speculation.stats.num_draft_tokens > 0


def test_repetition_penalty_equals_hf_generate():
    reference, _ = make_tiny_model("llama")
    prompts = BATCHES["batch8"]
    got, _ = greedy(prompts, {"repetition_penalty": 3.0})
    for prompt, tokens in zip(prompts, got):
        with torch.no_grad():
            out = reference.generate(
                torch.tensor([prompt]),
                max_new_tokens=NUM_TOKENS,
                do_sample=False,
                repetition_penalty=3.0,
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            )
        assert out[0, len(prompt) :].tolist() == tokens


def test_frequency_and_presence_penalties_equal_a_hand_written_loop():
    reference, _ = make_tiny_model("llama")
    prompts = BATCHES["batch8"]
    freq, pres = 0.7, 1.3
    got, _ = greedy(prompts, {"frequency_penalty": freq, "presence_penalty": pres})
    for prompt, tokens in zip(prompts, got):
        ids = list(prompt)
        for _ in range(NUM_TOKENS):
            with torch.no_grad():
                logits = reference(torch.tensor([ids])).logits[0, -1].clone()  # [vocab]
            for token, count in Counter(ids[len(prompt) :]).items():  # the output only, not the prompt
                logits[token] -= freq * count + pres
            ids.append(int(logits.argmax()))
        assert ids[len(prompt) :] == tokens


def test_each_verify_row_counts_the_drafts_before_it():
    counts = output_counts([5, 5, 7], [7, 9, 5], vocab=10, device="cpu")  # [4, 10]
    assert counts[:, 5].tolist() == [2, 2, 2, 3]  # row 3 sees the third draft, a 5
    assert counts[:, 7].tolist() == [1, 2, 2, 2]
    assert counts[:, 9].tolist() == [0, 0, 1, 1]
    assert counts.sum(dim=1).tolist() == [3, 4, 5, 6]
    assert output_counts([], [3, 3], vocab=4, device="cpu")[:, 3].tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "bad", [{"repetition_penalty": 0}, {"frequency_penalty": 2.5}, {"presence_penalty": "x"}]
)
def test_bad_penalties_are_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad).validate()


def penalized_distribution(rep: float, freq: float, pres: float) -> dict[tuple[int, ...], float]:
    """P(x_1..x_T | PROMPT) under the penalties: each conditional penalized with the tokens before it."""
    reference, _ = make_target()
    dist = {}
    for seq in itertools.product(range(VOCAB), repeat=MAX_TOKENS):
        ids = list(PROMPT) + list(seq)
        with torch.no_grad():
            logits = reference(torch.tensor([ids[:-1]])).logits[0]  # [len - 1, V]
        logp = 0.0
        for t in range(MAX_TOKENS):
            row = logits[len(PROMPT) - 1 + t].clone()
            seen_all = set(ids[: len(PROMPT) + t])
            for token in seen_all:
                row[token] = row[token] / rep if row[token] > 0 else row[token] * rep
            for token, count in Counter(seq[:t]).items():
                row[token] -= freq * count + pres
            logp += torch.log_softmax(row, dim=-1)[seq[t]].item()
        dist[seq] = math.exp(logp)
    return dist


def test_sampled_distribution_with_penalties_and_drafts_is_the_targets():
    rep, freq, pres = 1.5, 0.6, 0.4
    probs = penalized_distribution(rep, freq, pres)
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-9)
    _, model = make_target()
    spec = {"decoding_type": "DraftTarget", "max_draft_len": 2, "sample_drafts": True}
    executor = Executor(model, make_distribution_config(speculative_config=spec))
    params = [
        SamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=7_000 + i,
            repetition_penalty=rep,
            frequency_penalty=freq,
            presence_penalty=pres,
        )
        for i in range(NUM_SAMPLES)
    ]
    outputs = executor.run([Request(PROMPT, p) for p in params])
    assert executor.speculation.stats.num_draft_tokens > 0
    counts = Counter(tuple(o.token_ids) for o in outputs)
    p_value, cells = chi_square_p_value(counts, probs)
    assert cells > 10 and p_value > 1e-3, (p_value, cells)
    unpenalized = penalized_distribution(1.0, 0.0, 0.0)  # the test can tell the penalty apart
    assert chi_square_p_value(counts, unpenalized)[0] < 1e-6
