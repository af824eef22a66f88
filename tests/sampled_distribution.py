"""The exact distribution of a tiny target's samples, and a chi-square test of sampled counts against it.

The target is a tiny float64 llama with an 8-token vocabulary (`make_target`). The exact distribution
of its first ``MAX_TOKENS`` generated tokens after ``PROMPT`` is the product of its conditionals
(`exact_distribution`; `adjusted_distribution` and `biased_distribution` with each conditional's logits
changed first). `sample_sequences` samples ``NUM_SAMPLES`` requests (one seed each) in one run under
`sampling_config`, and `chi_square_p_value` compares the counts of whole sequences with the
probabilities (cells with a small expected count merged).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter

import torch
from factories import drafting_every_step, tiny_config
from specexec.drafters.base import Drafter
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.request import Request
from specexec.executor.executor import Executor
from specexec.executor.layers.quantized.quantization import quantize_model
from specexec.sampling import SamplingParams
from tiny_models import make_tiny_model

VOCAB = 8
#: a wider init than the default, so the distribution has most of its mass in a few dozen sequences
INIT_RANGE = 0.4
PROMPT = [1, 2, 3, 4, 1, 2, 3]  # repetitive, so the NGram drafter always finds a match
MAX_TOKENS = 4
NUM_SAMPLES = 4000
MIN_EXPECTED = 5.0  #: cells expected to be rarer than this are merged
P_VALUE_THRESHOLD = 1e-3


def make_target():
    return make_tiny_model("llama", vocab_size=VOCAB, initializer_range=INIT_RANGE)


def sampling_config(**overrides) -> ExecutorConfig:
    """`tiny_config` with pools for NUM_SAMPLES requests in one run; a drafter named in
    ``speculative_config`` drafts every step (`drafting_every_step`)."""
    if "speculative_config" in overrides:
        overrides["speculative_config"] = drafting_every_step(overrides["speculative_config"])
    return tiny_config(**{"num_kv_blocks": 2048, "max_num_tokens": 4096, "max_batch_size": 512, **overrides})


def sampled_requests(n: int, temperature: float = 1.0) -> list[Request]:
    """``n`` requests of PROMPT for MAX_TOKENS tokens, seeded 1000, 1001, ..."""
    return [
        Request(PROMPT, SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=1_000 + i))
        for i in range(n)
    ]


@functools.cache
def exact_distribution(
    temperature: float = 1.0, quantization: str | None = None
) -> dict[tuple[int, ...], float]:
    """P(x_1..x_T | PROMPT) for every sequence of T = MAX_TOKENS tokens: the product of the target's
    conditionals (of its ``quantization``-ed weights, if set), read off one forward over all V**(T-1)
    prefixes."""
    reference, _ = make_target()
    if quantization is not None:
        quantize_model(reference, quantization)
    prefixes = list(itertools.product(range(VOCAB), repeat=MAX_TOKENS - 1))
    with torch.no_grad():
        logits = reference(torch.tensor([PROMPT + list(p) for p in prefixes])).logits  # [rows, P+T-1, V]
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    start = len(PROMPT) - 1  # position whose logits give the first generated token
    dist = {}
    for row, prefix in enumerate(prefixes):
        head = sum(logp[row, start + t, x].item() for t, x in enumerate(prefix))
        last = logp[row, start + MAX_TOKENS - 1]  # [V]
        for x in range(VOCAB):
            dist[(*prefix, x)] = math.exp(head + last[x].item())
    return dist


def adjusted_distribution(adjust) -> dict[tuple[int, ...], float]:
    """P(x_1..x_T | PROMPT) when each conditional's logits [V] are first changed by ``adjust(row, seen,
    out)``: ``seen`` every token before the position (the prompt included), ``out`` the generated ones."""
    reference, _ = make_target()
    dist = {}
    for seq in itertools.product(range(VOCAB), repeat=MAX_TOKENS):
        ids = list(PROMPT) + list(seq)
        with torch.no_grad():
            logits = reference(torch.tensor([ids[:-1]])).logits[0]  # [len - 1, V]
        logp = 0.0
        for t in range(MAX_TOKENS):
            row = adjust(logits[len(PROMPT) - 1 + t].clone(), ids[: len(PROMPT) + t], seq[:t])
            logp += torch.log_softmax(row, dim=-1)[seq[t]].item()
        dist[seq] = math.exp(logp)
    return dist


def biased_distribution(bias: dict[int, float]) -> dict[tuple[int, ...], float]:
    """P(x_1..x_T | PROMPT) with the bias added to every conditional."""

    def add(row, seen, out):
        for token, value in bias.items():
            row[token] += value
        return row

    return adjusted_distribution(add)


def chi_square_p_value(counts: Counter, probs: dict[tuple[int, ...], float]) -> tuple[float, int]:
    """p-value of the counts under ``probs`` (cells expected below MIN_EXPECTED merged into one)."""
    n = sum(counts.values())
    assert set(counts) <= set(probs), "a generated sequence is not a sequence of MAX_TOKENS vocabulary ids"
    big = [cell for cell, p in probs.items() if n * p >= MIN_EXPECTED]
    observed = [counts.get(cell, 0) for cell in big]
    expected = [n * probs[cell] for cell in big]
    rest_expected = n - sum(expected)
    if rest_expected >= 1e-9:
        observed.append(n - sum(observed))
        expected.append(rest_expected)
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    dof = len(observed) - 1
    p_value = torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2))
    return float(p_value), len(observed)


@functools.cache
def plain_samples() -> list[list[int]]:
    """Each request's tokens without speculation (same seeds)."""
    _, outputs, _ = sample_sequences()
    return [o.token_ids for o in outputs]


def sample_sequences(drafter: Drafter | None = None, temperature: float = 1.0, **config_overrides):
    """NUM_SAMPLES sampled requests in one run: (the executor, the outputs, the counts of sequences)."""
    _, model = make_target()
    executor = Executor(model, sampling_config(**config_overrides), drafter=drafter)
    outputs = executor.run(sampled_requests(NUM_SAMPLES, temperature))
    assert all(len(o.token_ids) == MAX_TOKENS for o in outputs)
    bm = executor.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    draft_bm = getattr(executor.speculation.drafter, "block_manager", None)
    if draft_bm is not None:
        assert draft_bm.num_free_blocks == draft_bm.num_blocks
    assert executor.speculation.stats.num_drafter_errors == 0
    return executor, outputs, Counter(tuple(o.token_ids) for o in outputs)
