"""Greedy runs with drafts checked against the same runs without them, on the float64 tiny models.

- `BATCHES`: one repetitive prompt, and eight prompts of mixed lengths (three repetitive), so that the
  NGram drafter finds matches and the target accepts some drafts;
- `reference`: greedy output without speculation (computed once per arch, prompts and lengths);
- `run_speculative`: a run with a drafter, checked token for token against `reference`, every page free;
- `run_greedy` / `checked_greedy_tokens`: the tiny llama's greedy output with extra sampling params, with or
  without drafts (the latter also checks that no request failed and that the drafts were used);
- `num_accepted`, `num_drafted`; `SELF_DRAFT_SPEC`; `make_independent_draft_model`.
"""

from __future__ import annotations

import functools

from factories import assert_all_pages_free, drafting_config, greedy, greedy_requests
from specexec.drafters.base import Drafter
from specexec.executor.engine.request import FinishReason, Request
from specexec.executor.executor import Executor
from tiny_models import make_prompts, make_tiny_model

#: the int8 quantized copy of the target drafts
SELF_DRAFT_SPEC = {"decoding_type": "DraftTarget", "max_draft_len": 4}
MAX_TOKENS = 16
#: one repetitive prompt: the NGram drafter matches it and both archs accept some of its drafts
SINGLE_PROMPT = [9, 10, 11] * 6


def make_batch_prompts() -> list[list[int]]:
    """8 prompts, 1..30 tokens (96 in all, so one step admits them all), three of them repetitive."""
    prompts = make_prompts(8, [1, 30, 5, 17, 2, 12, 9, 20], seed=3)
    prompts[1] = [5, 6, 7, 8] * 7 + [5, 6]
    prompts[3] = [9, 10, 11] * 5 + [9, 10]
    prompts[7] = prompts[7][:5] * 4
    return prompts


BATCHES = {"batch1": [SINGLE_PROMPT], "batch8": make_batch_prompts()}


@functools.cache
def _reference(arch: str, prompts: tuple[tuple[int, ...], ...], max_tokens: tuple[int, ...]):
    _, model = make_tiny_model(arch)
    executor = Executor(model, drafting_config())
    outputs = executor.run(greedy_requests([list(p) for p in prompts], list(max_tokens)))
    return [o.token_ids for o in outputs]


def reference(arch: str, prompts: list[list[int]], max_tokens=MAX_TOKENS) -> list[list[int]]:
    """Greedy output without speculation (computed once per arch, prompts and lengths)."""
    if isinstance(max_tokens, int):
        max_tokens = [max_tokens] * len(prompts)
    return _reference(arch, tuple(map(tuple, prompts)), tuple(max_tokens))


def run_speculative(
    arch: str,
    prompts: list[list[int]],
    *,
    drafter: Drafter | None = None,
    max_tokens=MAX_TOKENS,
    expect_drafter_errors: bool = False,
    before_run=None,
    **config_overrides,
):
    """Run with speculation, check identity with the reference and that every page is free again."""
    _, model = make_tiny_model(arch)
    executor = Executor(model, drafting_config(**config_overrides), drafter=drafter)
    assert executor.speculation.drafter is not None
    if before_run is not None:
        before_run(executor)
    outputs = executor.run(greedy_requests(prompts, max_tokens))
    expected = reference(arch, prompts, max_tokens)
    for i, (out, want) in enumerate(zip(outputs, expected)):
        assert out.finish_reason is FinishReason.LENGTH, (i, out.error)
        assert out.token_ids == want, f"request {i} ({len(prompts[i])}-token prompt) differs without drafts"
    assert_all_pages_free(executor)
    if not expect_drafter_errors:
        assert executor.speculation.stats.num_drafter_errors == 0, "the drafter raised"
    return executor, outputs


def run_greedy(prompts, spec=None, **params) -> tuple[list, Executor]:
    """``prompts`` greedy for MAX_TOKENS tokens (EOS ignored, ``params`` added) on the tiny llama, drafting
    every step with ``spec`` where given; every page free after. The outputs and the executor."""
    _, model = make_tiny_model("llama")
    executor = Executor(model, drafting_config(speculative_config=spec))
    outputs = executor.run([Request(p, greedy(MAX_TOKENS, **params)) for p in prompts])
    assert_all_pages_free(executor)
    return outputs, executor


def checked_greedy_tokens(prompts, spec=None, **params) -> list[list[int]]:
    """`run_greedy`'s tokens, no request failed, and with ``spec`` the drafts' rows were used."""
    outputs, _ = run_greedy(prompts, spec, **params)
    assert all(o.error is None for o in outputs)
    if spec is not None:
        assert num_accepted(outputs) > 0  # the drafts' rows were used
    return [o.token_ids for o in outputs]


def num_accepted(outputs) -> int:
    return sum(o.metrics.num_accepted_tokens for o in outputs)


def num_drafted(outputs) -> int:
    return sum(o.metrics.num_draft_tokens for o in outputs)


def make_independent_draft_model():
    """A tiny model of the target's vocabulary with other weights, another arch and fewer layers."""
    _, draft = make_tiny_model("qwen3", seed=7, num_hidden_layers=2)
    return draft
