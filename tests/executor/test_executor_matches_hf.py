"""Greedy output of the executor equals Hugging Face `generate(do_sample=False)`, token for token.

Models are tiny, random and float64, so any difference in attention (pages, masks, sliding windows,
chunked prefill, recomputation after preemption) flips some argmax and shows up as a token mismatch.
"""

from __future__ import annotations

import functools

import pytest
import torch
from factories import greedy, tiny_config
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.request import FinishReason, Request
from specexec.executor.executor import Executor
from tiny_models import (
    ARCHS,
    EXTRA_ARCHS,
    SLIDING_ARCHS,
    SLIDING_WINDOW,
    hf_greedy,
    make_prompts,
    make_tiny_model,
)

MAX_TOKENS = 12
#: the configs below say speculative_config=None: plain decoding, one forward a token (the default drafts)
#: 8 prompts of mixed lengths 1..40 (several longer than the sliding window, one longer than 32)
MIXED_LENGTHS = [1, 40, 5, 17, 2, 33, 9, 26]


@functools.cache
def hf_reference(arch: str, prompts: tuple[tuple[int, ...], ...], max_tokens: int = MAX_TOKENS):
    """HF greedy outputs, computed once per (arch, prompts)."""
    ref, _ = make_tiny_model(arch)
    return [hf_greedy(ref, list(p), max_tokens) for p in prompts]


def run_executor(arch: str, prompts: list[list[int]], config: ExecutorConfig, max_tokens: int = MAX_TOKENS):
    _, model = make_tiny_model(arch)
    executor = Executor(model, config)
    outputs = executor.run(
        [Request(p, greedy(max_tokens), request_id=f"r{i}") for i, p in enumerate(prompts)]
    )
    bm = executor.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "pages leaked after run()"
    assert not bm.block_tables
    assert not executor.core.scheduler.has_unfinished()
    return executor, outputs


def assert_matches_reference(arch: str, prompts: list[list[int]], outputs, max_tokens: int = MAX_TOKENS):
    expected = hf_reference(arch, tuple(map(tuple, prompts)), max_tokens)
    for i, (prompt, out, want) in enumerate(zip(prompts, outputs, expected)):
        assert out.finish_reason is FinishReason.LENGTH, (i, out.error)
        assert out.prompt_token_ids == prompt
        assert out.token_ids == want, f"request {i} (prompt of {len(prompt)} tokens) differs from HF"


@pytest.mark.parametrize("arch", ARCHS)
def test_single_request_greedy_matches_hf_generate(arch):
    prompts = make_prompts(1, 13, seed=1)  # 13 + 12 tokens > the sliding window of 8
    _, outputs = run_executor(arch, prompts, tiny_config(speculative_config=None))
    assert_matches_reference(arch, prompts, outputs)
    assert outputs[0].metrics.num_forwards == MAX_TOKENS


@pytest.mark.parametrize("arch", ARCHS)
def test_eight_mixed_length_requests_in_one_run_match_hf_generate(arch):
    prompts = make_prompts(8, MIXED_LENGTHS, seed=2)
    assert sum(MIXED_LENGTHS) <= 256
    _, outputs = run_executor(arch, prompts, tiny_config(speculative_config=None, max_num_tokens=256))
    assert_matches_reference(arch, prompts, outputs)
    # all 8 were admitted together: prefill forward + one forward per further token, no preemption
    assert [o.metrics.num_forwards for o in outputs] == [MAX_TOKENS] * 8
    assert all(o.metrics.num_preemptions == 0 for o in outputs)


@pytest.mark.parametrize("arch", ARCHS)
def test_preempted_request_recomputes_identically(arch):
    prompts = make_prompts(8, MIXED_LENGTHS, seed=2)
    # 24 pages of 4 = 96 slots for 8 requests that need up to 52 each: someone must be preempted
    _, outputs = run_executor(arch, prompts, tiny_config(speculative_config=None, num_kv_blocks=24))
    assert max(o.metrics.num_preemptions for o in outputs) >= 1
    assert_matches_reference(arch, prompts, outputs)


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_longer_than_token_budget_is_prefilled_in_chunks_identically(arch):
    prompts = make_prompts(1, 40, seed=3)
    _, outputs = run_executor(arch, prompts, tiny_config(speculative_config=None, max_num_tokens=16))
    assert_matches_reference(arch, prompts, outputs)
    # 40 prompt tokens in chunks of 16, 16, 8 (the last also yields token 1), then 11 decode steps
    assert outputs[0].metrics.num_forwards == 3 + MAX_TOKENS - 1


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_preemption_and_batch_cap_together_match_hf_generate(arch):
    prompts = make_prompts(8, MIXED_LENGTHS, seed=4)
    config = tiny_config(speculative_config=None, num_kv_blocks=20, max_num_tokens=16, max_batch_size=3)
    executor, outputs = run_executor(arch, prompts, config)
    assert_matches_reference(arch, prompts, outputs)
    assert sum(o.metrics.num_forwards for o in outputs) > 8 * MAX_TOKENS  # some prompts were chunked
    assert max(o.metrics.num_preemptions for o in outputs) >= 1


@pytest.mark.parametrize("arch", ARCHS)
def test_long_prefills_joining_decoding_requests_match_hf_generate(arch):
    """Prompts over 64 tokens get their own attention group; here they are prefilled in the same
    forwards as other requests' decode steps (max_batch_size 2 staggers the admissions)."""
    prompts = make_prompts(4, [5, 90, 70, 2], seed=6)
    max_tokens = [3, MAX_TOKENS, 6, MAX_TOKENS]
    _, model = make_tiny_model(arch)
    executor = Executor(model, tiny_config(speculative_config=None, max_num_tokens=256, max_batch_size=2))
    outputs = executor.run(Request(p, greedy(n)) for p, n in zip(prompts, max_tokens))
    expected = hf_reference(arch, tuple(map(tuple, prompts)))
    for out, want, n in zip(outputs, expected, max_tokens):
        assert out.token_ids == want[:n]
    assert executor.block_manager.num_free_blocks == executor.block_manager.num_blocks


@pytest.mark.parametrize("arch", SLIDING_ARCHS)
def test_sliding_window_changes_the_output_so_the_tests_above_exercise_it(arch):
    """Guard for the test data: with the window removed, HF gives other tokens for a long prompt."""
    prompt = make_prompts(1, 26, seed=2)[0]
    assert len(prompt) + MAX_TOKENS > SLIDING_WINDOW
    ref, _ = make_tiny_model(arch)
    windowed = hf_greedy(ref, prompt, MAX_TOKENS)
    overrides = {"sliding_window": None}
    if arch == "gemma3":
        overrides = {"layer_types": ["full_attention"] * 4}
    unwindowed_model, _ = make_tiny_model(arch, **overrides)
    assert windowed != hf_greedy(unwindowed_model, prompt, MAX_TOKENS)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize(
    ("block_size", "num_kv_blocks", "max_num_tokens", "max_batch_size"),
    [
        (1, 120, 64, 8),  # one token per page
        (3, 40, 64, 8),  # pages that do not divide the window or the prompts
        (16, 8, 64, 8),  # pages larger than the window; preempts
        (4, 30, 1, 8),  # one token per forward
        (4, 30, 5, 1),  # one request at a time
        (2, 40, 7, 3),  # chunks, preemption and a batch cap at once
    ],
)
def test_page_size_and_budget_extremes_match_hf_generate(
    arch, block_size, num_kv_blocks, max_num_tokens, max_batch_size
):
    prompts = make_prompts(8, MIXED_LENGTHS, seed=2)
    config = tiny_config(
        speculative_config=None,
        block_size=block_size,
        num_kv_blocks=num_kv_blocks,
        max_num_tokens=max_num_tokens,
        max_batch_size=max_batch_size,
    )
    _, outputs = run_executor(arch, prompts, config)
    assert_matches_reference(arch, prompts, outputs)


@pytest.mark.parametrize("arch", EXTRA_ARCHS)
def test_softcapped_attention_with_preemption_matches_hf_generate(arch):
    prompts = make_prompts(8, MIXED_LENGTHS, seed=2)
    _, outputs = run_executor(
        arch, prompts, tiny_config(speculative_config=None, num_kv_blocks=24, max_num_tokens=32)
    )
    assert max(o.metrics.num_preemptions for o in outputs) >= 1
    assert_matches_reference(arch, prompts, outputs)


def test_float32_model_matches_hf_generate_too():
    prompts = make_prompts(4, [3, 20, 11, 1], seed=5)
    ref, model = make_tiny_model("llama", dtype=torch.float32)
    executor = Executor(model, tiny_config(speculative_config=None, dtype="float32"))
    outputs = executor.run(prompts, greedy(MAX_TOKENS))
    assert [o.token_ids for o in outputs] == [hf_greedy(ref, p, MAX_TOKENS) for p in prompts]
    assert executor.block_manager.num_free_blocks == executor.block_manager.num_blocks
