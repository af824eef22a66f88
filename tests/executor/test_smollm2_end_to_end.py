"""End to end on the real model: SmolLM2-135M-Instruct in float32 against HF `generate`."""

from __future__ import annotations

import pytest
import torch
from specexec import Executor, ExecutorConfig, SamplingParams
from specexec.executor.model.model_loader import load_model

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("all_threads")]


PROMPTS = [
    "What is the capital of France?",
    "Explain photosynthesis in one paragraph.",
    "Write a haiku about the sea.",
    "List three uses of a paperclip.",
    "How do I reverse a list in Python?",
    "What causes the seasons on Earth?",
    "Give me a recipe for pancakes.",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet.",
    "What is 17 times 23?",
    "Describe a cat to someone who has never seen one.",
    "Write a short motivational quote.",
    "What are the benefits of regular exercise?",
    "Explain what a neural network is to a child.",
    "Name five countries in Africa.",
    "How does a bicycle stay upright?",
    "Write the opening line of a mystery novel.",
    "What is the difference between weather and climate?",
    "Suggest a name for a pet goldfish.",
]
MAX_TOKENS = 48


def make_chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_greedy_matches_hf_generate_on_smollm2():
    reference = load_model(None, dtype="float32")
    tokenizer = reference.tokenizer
    executor = Executor(load_model(None, dtype="float32").model, ExecutorConfig(), tokenizer=tokenizer)
    outputs = executor.run([make_chat(p) for p in PROMPTS], SamplingParams(max_tokens=MAX_TOKENS))

    identical = 0
    for prompt, out in zip(PROMPTS, outputs):
        assert out.error is None
        ids = torch.tensor([out.prompt_token_ids])
        with torch.inference_mode():
            hf = reference.model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)[0, ids.shape[1] :]
        hf_ids = hf.tolist()
        identical += hf_ids == out.token_ids
        print(f"{prompt[:40]!r}: common prefix {common_prefix(hf_ids, out.token_ids)}/{len(hf_ids)}")
    match_rate = identical / len(PROMPTS)
    print(f"identical sequences: {identical}/{len(PROMPTS)} ({match_rate:.0%})")
    assert match_rate >= 0.95
    assert executor.block_manager.num_free_blocks == executor.block_manager.num_blocks
