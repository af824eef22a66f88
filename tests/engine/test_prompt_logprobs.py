"""Prompt log-probabilities (``SamplingParams.prompt_logprobs``, `sampling/prompt_logprobs.py`): equal to
an HF forward's log-softmax on the float64 tiny model, whole or in prefill chunks, beside other requests,
with drafts and after preemption; ``max_tokens=0`` scores the prompt and emits nothing; every page free."""

from __future__ import annotations

import pytest
import torch
from factories import assert_all_pages_free, drafting_config
from specexec.executor.engine.request import FinishReason, Request
from specexec.executor.executor import Executor
from specexec.sampling import SamplingParams
from tiny_models import make_prompts, make_tiny_model

PROMPTS = make_prompts(5, [23, 1, 9, 40, 17], seed=11)
PROMPTS[3] = [5, 6, 7, 8] * 10  # repetitive: NGram drafts its output


def hf_prompt_logprobs(model, prompt: list[int], top: int) -> list[tuple[int, float, list[int]]]:
    """(token, its log-probability, the top ids) of prompt tokens 1.. from one HF forward."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt])).logits[0].double(), dim=-1)  # [len, V]
    return [
        (prompt[p + 1], logp[p, prompt[p + 1]].item(), logp[p].topk(top).indices.tolist())
        for p in range(len(prompt) - 1)
    ]


@pytest.mark.parametrize(
    "setting",
    ["whole", "chunked", "ngram", "preemption"],
)
def test_prompt_logprobs_equal_an_hf_forward(setting):
    model, copy = make_tiny_model("llama")
    overrides = {
        "chunked": {"max_num_tokens": 8},
        "ngram": {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 3}},
        "preemption": {"num_kv_blocks": 24, "max_num_tokens": 16},
    }.get(setting, {})
    executor = Executor(copy, drafting_config(**overrides))
    top = 3
    requests = [
        Request(p, SamplingParams(max_tokens=m, ignore_eos=True, prompt_logprobs=top), request_id=f"r{i}")
        for i, (p, m) in enumerate(zip(PROMPTS, [6, 0, 12, 20, 0]))
    ]
    requests.append(Request(PROMPTS[0], SamplingParams(max_tokens=6, ignore_eos=True), request_id="plain"))
    outputs = executor.run(requests)
    for prompt, out, max_tokens in zip(PROMPTS, outputs, [6, 0, 12, 20, 0]):
        assert out.error is None, out.error
        assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
        want = hf_prompt_logprobs(model, prompt, top)
        for entry, (token, logprob, top_ids) in zip(out.prompt_logprobs[1:], want):
            assert entry.token_id == token
            assert entry.logprob == pytest.approx(logprob, abs=1e-9)
            assert [t for t, _ in entry.top] == top_ids
        assert len(out.token_ids) == max_tokens
        if max_tokens == 0:
            assert out.finish_reason is FinishReason.LENGTH and out.text == ""
    if setting == "preemption":  # (the setting does what it says)
        assert sum(o.metrics.num_preemptions for o in outputs) > 0
    if setting == "chunked":
        assert outputs[3].metrics.num_forwards > 20 + 40 // 8
    assert outputs[-1].prompt_logprobs is None
    assert outputs[-1].token_ids == outputs[0].token_ids  # scoring the prompt changes no output token
    assert_all_pages_free(executor)


def test_max_tokens_0_needs_prompt_logprobs():
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0).validate()
    SamplingParams(max_tokens=0, prompt_logprobs=0).validate()
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21).validate()
