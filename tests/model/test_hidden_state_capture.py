"""Captured hidden states of a paged forward equal Hugging Face's `output_hidden_states=True`."""

from __future__ import annotations

import pytest
import torch
from factories import tiny_config
from specexec.executor.config import ExecutorConfig
from specexec.executor.executor import Executor
from specexec.executor.model.forward_io import SequenceInput
from tiny_models import make_prompts, make_tiny_model

NUM_LAYERS = 4
CAPTURED = [0, 1, NUM_LAYERS // 2, NUM_LAYERS]


def capturing_executor(arch: str):
    """(the HF reference, an executor over its copy capturing the CAPTURED hidden-state layers)."""
    ref, model = make_tiny_model(arch, num_hidden_layers=NUM_LAYERS)
    config = tiny_config(num_kv_blocks=32, max_num_tokens=64, capture_hidden_layers=CAPTURED)
    return ref, Executor(model, config)


@torch.no_grad()
def hf_hidden_states(ref, tokens: list[int]):
    out = ref(torch.tensor([tokens]), output_hidden_states=True, use_cache=False)
    assert len(out.hidden_states) == NUM_LAYERS + 1
    return out.hidden_states, out.logits[0]


def assert_captured_equal_hf(output, ref, sequences: list[list[int]], new_lens: list[int]):
    assert sorted(output.hidden_states) == CAPTURED
    for k, (tokens, n) in enumerate(zip(sequences, new_lens)):
        expected, logits = hf_hidden_states(ref, tokens)
        rows = slice(output.cu_tokens[k], output.cu_tokens[k + 1])
        assert rows.stop - rows.start == n
        for i in CAPTURED:
            got = output.hidden_states[i][rows]
            assert got.shape == (n, ref.config.hidden_size)
            torch.testing.assert_close(got, expected[i][0, -n:], rtol=1e-9, atol=1e-9, msg=f"layer {i}")
        torch.testing.assert_close(output.logits[output.cu_logit_rows[k]], logits[-1], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_captured_hidden_states_match_hf_for_prefill_then_decode(arch):
    ref, executor = capturing_executor(arch)
    bm, runner = executor.block_manager, executor.core.runner
    prompts = make_prompts(2, [7, 13], seed=7)  # 13 > the gemma3 sliding window

    for i, p in enumerate(prompts):
        bm.allocate(f"s{i}", len(p))
    prefill = [SequenceInput(p, 0, bm.block_tables[f"s{i}"], 1) for i, p in enumerate(prompts)]
    output = runner.forward(prefill)
    assert output.cu_tokens == [0, 7, 20]
    assert_captured_equal_hf(output, ref, prompts, [7, 13])

    next_tokens = output.logits.argmax(-1).tolist()
    decode = []
    for i, (p, t) in enumerate(zip(prompts, next_tokens)):
        bm.append(f"s{i}", 1)
        decode.append(SequenceInput([t], len(p), bm.block_tables[f"s{i}"], 1))
    output = runner.forward(decode)
    assert output.cu_tokens == [0, 1, 2]
    assert_captured_equal_hf(output, ref, [p + [t] for p, t in zip(prompts, next_tokens)], [1, 1])


def test_capture_layer_out_of_range_is_rejected():
    _, model = make_tiny_model("llama", num_hidden_layers=NUM_LAYERS)
    config = ExecutorConfig(num_kv_blocks=8, block_size=4, dtype="float64", capture_hidden_layers=[5])
    with pytest.raises(ValueError, match="capture layer 5 is out of range 0..4"):
        Executor(model, config)
