"""LayerSkip self-speculation: the target's own layers, some skipped, draft into its own KV cache.

Greedy output must stay token-identical to decoding without drafts (float64 tiny Llama, batch 1 and 8,
with preemption and prefix caching), every page free afterwards, and the skipped layers chosen at
start-up must be one of the candidate sets; bad options are refused by name."""

from __future__ import annotations

import pytest
from specexec.drafters.layer_skip.choice import candidate_sets, expected_speedup
from specexec.executor.config import ExecutorConfig
from specexec.executor.executor import Executor
from speculative_runs import BATCHES, num_accepted, num_drafted, run_speculative
from tiny_models import make_tiny_model

SPEC = {"decoding_type": "LayerSkip", "max_draft_len": 3, "skip_layers": [2]}


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize(
    "overrides",
    [{}, {"num_kv_blocks": 40}, {"enable_prefix_caching": True}],
    ids=["plain", "preemption", "prefix-caching"],
)
def test_layer_skip_keeps_greedy_output_identical(batch, overrides):
    executor, outputs = run_speculative("llama", BATCHES[batch], speculative_config=SPEC, **overrides)
    assert executor.speculation.drafter.skipped == (2,)
    assert num_drafted(outputs) > 0 and num_accepted(outputs) > 0


def test_the_draft_writes_no_memory_of_its_own():
    """Its K/V are the target's pages: the drafter holds no cache, no pool, no copy of a layer."""
    executor, _ = run_speculative("llama", BATCHES["batch1"], speculative_config=SPEC)
    drafter = executor.speculation.drafter
    assert not hasattr(drafter, "block_manager") and drafter.torch_modules() == []
    target_layers = list(executor.core.runner.model.model.layers)
    assert all(any(layer is t for t in target_layers) for layer in drafter._layers)


def test_candidate_sets_keep_the_first_and_last_layer():
    for num_layers in (4, 6, 30):
        sets = candidate_sets(num_layers)
        assert sets and all(0 not in c.skipped and num_layers - 1 not in c.skipped for c in sets)
        assert len({c.skipped for c in sets}) == len(sets)
    assert candidate_sets(3) == []
    assert expected_speedup(0.0, 0.5, 3) < 1 < expected_speedup(0.9, 0.3, 3)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"skip_layers": []}, "skip_layers must be a non-empty list"),
        ({"skip_layers": [1, -1]}, "skip_layers must be a non-empty list"),
        ({"calibration_tokens": 0}, "calibration_tokens"),
        ({"skip_layer": [1]}, "unknown LayerSkip option"),
    ],
)
def test_bad_options_are_refused_before_loading(options, message):
    _, model = make_tiny_model("llama")
    spec = {"decoding_type": "LayerSkip", **options}
    with pytest.raises(ValueError, match=message):
        Executor(
            model, ExecutorConfig(dtype="float64", device="cpu", num_kv_blocks=64, speculative_config=spec)
        )


def test_skip_layers_beyond_the_model_are_refused():
    _, model = make_tiny_model("llama")
    spec = {"decoding_type": "LayerSkip", "skip_layers": [0, 1, 2, 3, 40]}
    with pytest.raises(ValueError, match="the target has layers"):
        Executor(
            model, ExecutorConfig(dtype="float64", device="cpu", num_kv_blocks=64, speculative_config=spec)
        )


def test_the_skipped_layers_are_chosen_at_start_up_on_the_targets_own_continuation():
    """No skip_layers: one of the candidate sets, scored on calibration text the target continued."""
    from grammar_support import smollm2_tokenizer

    _, model = make_tiny_model("llama", vocab_size=49152, num_hidden_layers=6)
    spec = {"decoding_type": "LayerSkip", "calibration_tokens": 4}
    config = ExecutorConfig(dtype="float64", device="cpu", num_kv_blocks=64, speculative_config=spec)
    executor = Executor(model, config, tokenizer=smollm2_tokenizer())
    drafter = executor.speculation.drafter
    assert drafter.skipped in {c.skipped for c in candidate_sets(6)}
    assert drafter.choice.startswith("chosen at start-up") and 0 <= drafter.initial_acceptance <= 1
    assert executor.block_manager.num_free_blocks == executor.block_manager.num_blocks  # scratch pages freed
