"""End to end: the shipped Medusa heads on the embedded SmolLM2-135M-Instruct (float32, greedy).

Outputs with Medusa drafting (chains and trees) must equal those without drafting token for token, and
the trained heads must draft usefully on held-out extraction prompts (benchmark draws, never trained
on): acceptance length well above one.
"""

from __future__ import annotations

import json

import pytest
from specexec import Executor, ExecutorConfig, SamplingParams
from specexec.drafters.medusa.heads import SHIPPED_HEADS
from specexec.executor.model.model_loader import load_model
from specexec.prompt_sets.datasets import load_dataset

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("all_threads")]

MAX_TOKENS = 48


def test_shipped_heads_are_in_their_layout_and_small():
    config = json.loads((SHIPPED_HEADS / "config.json").read_text())
    assert config["architectures"] == ["MedusaHeads"] and config["hidden_size"] == 576
    assert config["vocab_size"] == 49152 and config["draft_vocab_size"] < 49152
    assert (SHIPPED_HEADS / "model.safetensors").stat().st_size <= 16 * 2**20


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_medusa_on_smollm2_is_lossless_and_accepts_drafts(tree):
    prompts = [p.messages for p in load_dataset("extraction", 2)]
    params = SamplingParams(max_tokens=MAX_TOKENS)
    loaded = load_model(None, dtype="float32")
    plain = Executor(loaded.model, ExecutorConfig(), tokenizer=loaded.tokenizer).run(prompts, params)
    spec = {"decoding_type": "Medusa", "max_draft_len": 3, "draft_len_policy": "fixed", "draft_tree": tree}
    loaded = load_model(None, dtype="float32")  # a fresh copy: the first executor holds the other
    medusa = Executor(loaded.model, ExecutorConfig(speculative_config=spec), tokenizer=loaded.tokenizer)
    outputs = medusa.run(prompts, params)
    for want, got in zip(plain, outputs):
        assert got.error is None
        assert got.token_ids == want.token_ids
    steps = sum(o.metrics.num_decode_steps for o in outputs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    assert (steps + accepted) / steps > 1.4, "the shipped heads should gain well over one token per step"
    assert not medusa.block_manager.block_tables
