"""End to end: the shipped EAGLE-3 head on the embedded SmolLM2-135M-Instruct (float32, greedy).

Outputs with EAGLE-3 drafting must equal those without drafting token for token (the match rate is
asserted to be total here: float32, one process, the same executor), and the trained head must draft
usefully where it is strongest: on held-out extraction prompts (benchmark draws, never trained on) its
mean acceptance length at k=3 is well above one. (On open chat, Spec-Bench, the shipped head accepts
little: see the benchmark report.)
"""

from __future__ import annotations

import json

import pytest
from specexec import Executor, ExecutorConfig, SamplingParams
from specexec.drafters.eagle3.head import SHIPPED_HEAD
from specexec.executor.model.model_loader import load_model
from specexec.prompt_sets.datasets import load_dataset

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("all_threads")]

MAX_TOKENS = 48


def test_shipped_head_is_in_the_published_layout_and_small():
    config = json.loads((SHIPPED_HEAD / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["vocab_size"] == 49152 and config["draft_vocab_size"] < 49152
    assert (SHIPPED_HEAD / "model.safetensors").stat().st_size <= 25 * 2**20


def test_eagle3_on_smollm2_is_lossless_and_accepts_drafts():
    loaded = load_model(None, dtype="float32")
    prompts = [p.messages for p in load_dataset("extraction", 2)]
    params = SamplingParams(max_tokens=MAX_TOKENS)
    plain = Executor(loaded.model, ExecutorConfig(), tokenizer=loaded.tokenizer).run(prompts, params)
    spec = {"decoding_type": "Eagle", "max_draft_len": 3}
    loaded = load_model(None, dtype="float32")  # a fresh copy: the first executor holds the other
    eagle = Executor(loaded.model, ExecutorConfig(speculative_config=spec), tokenizer=loaded.tokenizer)
    outputs = eagle.run(prompts, params)
    for want, got in zip(plain, outputs):
        assert got.error is None
        assert got.token_ids == want.token_ids
    steps = sum(o.metrics.num_decode_steps for o in outputs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    assert (steps + accepted) / steps > 1.5, "the shipped head should gain well over one token per step"
    assert all(not b.block_tables for b in (eagle.block_manager, eagle.speculation.drafter.block_manager))
