"""Every bad config key or drafter option is refused with a ValueError naming it, before any model loads
(the loader is patched to fail the test if it is reached)."""

from __future__ import annotations

import pytest
import torch
from specexec import Executor, ExecutorConfig
from specexec.drafters import Drafter
from specexec.executor import executor as executor_module
from specexec.executor.model import model_loader
from tiny_models import make_tiny_model, save_tiny_model_dir


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was checked")

    monkeypatch.setattr(model_loader, "load_model", refuse)
    monkeypatch.setattr(executor_module, "build_engine_core", refuse)


def test_an_unknown_config_key_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="unknown config key 'unknown_key'; allowed: model, dtype"):
        ExecutorConfig(unknown_key=1)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"decoding_type": "Eagle", "eagle3_one_model": True}, ["unknown Eagle option 'eagle3_one_model'"]),
        (
            {"decoding_type": "NGram", "max_matching_ngram_size": 0},
            ["max_matching_ngram_size", "integer >= 1"],
        ),
        (
            {"decoding_type": "DraftTarget", "speculative_model": "/no/such/model"},
            ["/no/such/model", "does not exist"],
        ),
        ({"decoding_type": "DraftTarget", "kv_cache_memory_gb": -1}, ["kv_cache_memory_gb", "> 0"]),
        ({"decoding_type": "Eagle", "sample_drafts": "yes"}, ["sample_drafts", "true or false"]),
        ({"decoding_type": "Eagle", "prompt_lookup": 1}, ["prompt_lookup", "true or false"]),
        (
            {
                "decoding_type": "UserProvided",
                "drafter": "test_config_checks:SmallDrafter",
                "drafter_options": {"size": 2},
            },
            ["drafter_options", "size"],
        ),
        ({"decoding_type": "Hydra"}, ["unknown speculative_config.decoding_type 'Hydra'", "NGram"]),
    ],
)
def test_bad_drafter_options_are_refused_before_loading(no_loading, spec, words):
    with pytest.raises(ValueError) as info:
        Executor(config=ExecutorConfig(speculative_config={"max_draft_len": 3, **spec}))
    for word in words:
        assert word in str(info.value)


class SmallDrafter(Drafter):
    def __init__(self, max_draft_len: int, scale: float = 1.0) -> None:
        super().__init__(max_draft_len)
        self.scale = scale


def test_a_vllm_style_block_is_answered_with_the_keys_to_use():
    with pytest.raises(ValueError) as info:
        ExecutorConfig(
            speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
        )
    message = str(info.value)
    for hint in (
        "'method' -> decoding_type",
        "'num_speculative_tokens' -> max_draft_len",
        "max_matching_ngram_size",
    ):
        assert hint in message


def test_max_model_len_beyond_the_embedded_models_context_is_refused_before_loading(no_loading):
    with pytest.raises(ValueError, match="'max_model_len': got 100000; allowed: at most 8192"):
        Executor(config=ExecutorConfig(max_model_len=100_000))


def test_max_model_len_beyond_a_directory_models_context_is_refused_before_loading(no_loading, tmp_path):
    path = save_tiny_model_dir(tmp_path / "tiny")  # max_position_embeddings 256
    with pytest.raises(ValueError, match="at most 256"):
        Executor(path, ExecutorConfig(max_model_len=257))


def test_max_model_len_beyond_a_loaded_models_context_is_refused():
    _, model = make_tiny_model("llama")
    with pytest.raises(ValueError, match="at most 256"):
        Executor(model, ExecutorConfig(max_model_len=1000, device="cpu"))
    executor = Executor(model, ExecutorConfig(max_model_len=256, device="cpu", num_kv_blocks=64))
    assert executor.core.max_model_len == 256


def test_a_drafter_that_is_not_a_drafter_is_refused_before_loading(no_loading):
    with pytest.raises(ValueError, match="must be a specexec Drafter"):
        Executor(config=ExecutorConfig(), drafter=object())  # type: ignore[arg-type]


def test_a_module_passed_in_moves_to_the_named_device_and_a_missing_one_is_refused():
    _, model = make_tiny_model("llama")
    executor = Executor(model, ExecutorConfig(device="cpu", num_kv_blocks=64, dtype="float64"))
    assert executor.core.runner.device.type == "cpu"
    executor.close()
    if not torch.cuda.is_available():
        with pytest.raises(model_loader.ModelLoadError, match="CUDA is not available"):
            Executor(model, ExecutorConfig(device="cuda", num_kv_blocks=64))
