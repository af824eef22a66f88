"""Repetition, frequency and presence penalties: exact against independent references, and lossless
with drafts (greedy identity for every drafter kind on the float64 tiny model, with drafts accepted; the
sampled distribution at temperature 1 by a chi-square test)."""

from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch
from eagle3_heads import eagle_spec, make_head_dir
from sampled_distribution import (
    MAX_TOKENS,
    NUM_SAMPLES,
    PROMPT,
    adjusted_distribution,
    chi_square_p_value,
    make_target,
    sampling_config,
)
from specexec.executor.engine.request import Request
from specexec.executor.executor import Executor
from specexec.sampling import SamplingParams
from specexec.sampling import penalties as penalties_module
from specexec.sampling.penalties import PenalizedRows, PenaltyMetadata, apply_penalties_inplace, count_tokens
from speculative_runs import BATCHES, SELF_DRAFT_SPEC, run_greedy
from speculative_runs import MAX_TOKENS as NUM_TOKENS  # run_greedy's length
from tiny_models import make_tiny_model

#: Each changes the tiny model's greedy output (checked), yet leaves it repetitive enough that every
#: drafter gets drafts accepted (checked too): a strong discouraging penalty leaves NGram nothing to match.
PENALTIES = {
    "repetition": {"repetition_penalty": 1.05},
    "repetition-below-1": {"repetition_penalty": 0.5},
    "frequency": {"frequency_penalty": 0.1},
    "frequency-negative": {"frequency_penalty": -1.5},
    "presence": {"presence_penalty": 0.1},
    "presence-negative": {"presence_penalty": -2.0},
    "all": {"repetition_penalty": 1.05, "frequency_penalty": 0.1, "presence_penalty": -0.5},
}
NGRAM = {"decoding_type": "NGram", "max_draft_len": 3}


@functools.cache
def reference_tokens(batch: str, penalty: str | None) -> list[list[int]]:
    """Greedy output without drafts (once per batch and penalty)."""
    outputs, _ = run_greedy(BATCHES[batch], **(PENALTIES[penalty] if penalty else {}))
    return [o.token_ids for o in outputs]


def make_eagle_spec(tmp_path, want: list[list[int]]) -> dict:
    """A random EAGLE-3 head whose draft vocabulary is the one token the target emits most: it proposes
    that token always, so it is accepted wherever the target emits it (a random head over a wider
    vocabulary would have every draft rejected, and the drafts' rows would check nothing)."""
    (common, _), *_ = Counter(t for tokens in want for t in tokens[1:]).most_common(1)
    make_head_dir(tmp_path, draft_vocab=1, draft_ids=[common])
    return eagle_spec(tmp_path)


@pytest.mark.parametrize("batch", ["batch1", "batch8"])
@pytest.mark.parametrize("drafter", ["ngram", "self-draft", "eagle3"])
@pytest.mark.parametrize("penalty", list(PENALTIES))
def test_greedy_output_with_drafts_equals_without(tmp_path, penalty, drafter, batch):
    want = reference_tokens(batch, penalty)
    assert want != reference_tokens(batch, None), "the penalty changed nothing: the test would check nothing"
    spec = {"ngram": NGRAM, "self-draft": SELF_DRAFT_SPEC}.get(drafter) or make_eagle_spec(tmp_path, want)
    outputs, _ = run_greedy(BATCHES[batch], spec, **PENALTIES[penalty])
    assert [o.token_ids for o in outputs] == want
    # accepted drafts: rows past the first were used, each penalized with the drafts before it
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0


def test_strong_penalties_with_drafts_equal_without():
    """Penalties strong enough that no token repeats (NGram finds nothing): the self-draft still drafts."""
    strong = {"repetition_penalty": 3.0, "frequency_penalty": 2.0, "presence_penalty": 2.0}
    want, _ = run_greedy(BATCHES["batch8"], **strong)
    got, executor = run_greedy(BATCHES["batch8"], SELF_DRAFT_SPEC, **strong)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert sum(o.metrics.num_accepted_tokens for o in got) > 0
    assert all(len(set(o.token_ids)) == len(o.token_ids) for o in got)


def test_repetition_penalty_equals_hf_generate():
    reference, _ = make_tiny_model("llama")
    prompts = BATCHES["batch8"]
    got, _ = run_greedy(prompts, repetition_penalty=3.0)
    for prompt, out in zip(prompts, got):
        with torch.no_grad():
            tokens = reference.generate(
                torch.tensor([prompt]),
                max_new_tokens=NUM_TOKENS,
                do_sample=False,
                repetition_penalty=3.0,
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            )
        assert tokens[0, len(prompt) :].tolist() == out.token_ids


def test_frequency_and_presence_penalties_equal_a_hand_written_loop():
    reference, _ = make_tiny_model("llama")
    prompts = BATCHES["batch8"]
    freq, pres = 0.7, 1.3
    got, _ = run_greedy(prompts, frequency_penalty=freq, presence_penalty=pres)
    for prompt, out in zip(prompts, got):
        ids = list(prompt)
        for _ in range(NUM_TOKENS):
            with torch.no_grad():
                logits = reference(torch.tensor([ids])).logits[0, -1].clone()  # [vocab]
            for token, count in Counter(ids[len(prompt) :]).items():  # the output only, not the prompt
                logits[token] -= freq * count + pres
            ids.append(int(logits.argmax()))
        assert ids[len(prompt) :] == out.token_ids


def test_each_verify_row_counts_the_drafts_before_it():
    requests = [PenalizedRows(0, [1], [5, 5, 7], [7, 9, 5]), PenalizedRows(4, [], [], [3, -1, 3])]
    meta = PenaltyMetadata.build(requests, vocab=10, device="cpu")
    counts = count_tokens(meta, 0, 2, vocab=10)  # [8, 10]
    assert counts[:4, 5].tolist() == [2, 2, 2, 3]  # row 3 sees the third draft, a 5
    assert counts[:4, 7].tolist() == [1, 2, 2, 2]
    assert counts[:4, 9].tolist() == [0, 0, 1, 1]
    assert counts[:4].sum(dim=1).tolist() == [3, 4, 5, 6]
    assert counts[4:, 3].tolist() == [0, 1, 1, 2]  # (the -1 draft counts nothing)
    assert counts[4:].sum().item() == 4 and counts[:, 1].sum().item() == 0  # (the prompt is not counted)


def penalize_one_row(row: torch.Tensor, r: PenalizedRows, j: int) -> torch.Tensor:
    """Row j of request r penalized by hand, token by token."""
    row = row.clone()
    before = list(r.output_ids) + [d for d in r.draft_ids[:j] if d >= 0]
    if r.repetition_penalty != 1:
        for token in set(r.prompt_ids) | set(before):
            p = r.repetition_penalty
            row[token] = row[token] / p if row[token] > 0 else row[token] * p
    for token, count in Counter(before).items():
        row[token] -= r.frequency_penalty * count + r.presence_penalty
    return row


def make_penalized_rows(vocab: int) -> list[PenalizedRows]:
    """Requests with every mix of penalties, drafts and none, a -1 draft, rows left between them."""
    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    return [
        PenalizedRows(0, ids(9), ids(20), ids(3), repetition_penalty=1.7),
        PenalizedRows(5, ids(4), ids(7), [], frequency_penalty=0.6, presence_penalty=-0.4),
        PenalizedRows(6, ids(30), ids(1), ids(2) + [-1], 0.8, -1.2, 1.5),
        PenalizedRows(11, ids(2), [], ids(4), presence_penalty=2.0),
        PenalizedRows(16, ids(5), ids(12), ids(1), repetition_penalty=1.3, frequency_penalty=2.0),
    ]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", ["one-chunk", "small-chunks"])
def test_batched_penalties_equal_a_row_by_row_loop(monkeypatch, dtype, chunk):
    vocab = 50
    if chunk == "small-chunks":  # a few requests' rows at a time, as on the CPU with a large vocabulary
        monkeypatch.setattr(penalties_module, "CPU_CHUNK_ELEMENTS", 4 * vocab)
    requests = make_penalized_rows(vocab)
    logits = torch.randn(20, vocab, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    logits[:, ::7] = float("-inf")  # masked tokens (some of them in the histories)
    logits = logits.to(dtype)
    got = logits.clone()
    apply_penalties_inplace(got, PenaltyMetadata.build(requests, vocab, "cpu"))
    want = logits.clone()
    for r in requests:
        for j in range(1 + len(r.draft_ids)):
            want[r.first_row + j] = penalize_one_row(logits[r.first_row + j].double(), r, j).to(dtype)
    exact = {"rtol": 0, "atol": 0} if dtype == torch.float64 else {}  # (float32 arithmetic rounds otherwise)
    torch.testing.assert_close(got, want, **exact)
    assert torch.equal(got[[4, 10, 18, 19]], logits[[4, 10, 18, 19]]), "rows of no request were touched"
    assert torch.equal(got[:, ::7].isinf(), logits[:, ::7].isinf()), "a penalty un-masked a token"


@pytest.mark.parametrize(
    "bad", [{"repetition_penalty": 0}, {"frequency_penalty": 2.5}, {"presence_penalty": "x"}]
)
def test_bad_penalties_are_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad).validate()


def penalized_distribution(rep: float, freq: float, pres: float) -> dict[tuple[int, ...], float]:
    """P(x_1..x_T | PROMPT) under the penalties: each conditional penalized with the tokens before it."""

    def penalize(row, seen, out):
        for token in set(seen):
            row[token] = row[token] / rep if row[token] > 0 else row[token] * rep
        for token, count in Counter(out).items():
            row[token] -= freq * count + pres
        return row

    return adjusted_distribution(penalize)


def test_sampled_distribution_with_penalties_and_drafts_is_the_targets():
    rep, freq, pres = 1.5, 0.6, 0.4
    probs = penalized_distribution(rep, freq, pres)
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-9)
    _, model = make_target()
    spec = {"decoding_type": "DraftTarget", "max_draft_len": 2, "sample_drafts": True}
    executor = Executor(model, sampling_config(speculative_config=spec))
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
