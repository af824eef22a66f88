"""The two defaults: ``quantization: auto`` runs a GGUF at its own codes where its kernels run and
anything else as loaded; ``speculative_config: auto`` drafts with Suffix under the auto policy. Either
turns off with ``none``, and the executor says which ran and why."""

from __future__ import annotations

import pytest
from specexec import Executor, ExecutorConfig, Request, SamplingParams
from specexec.executor.auto_defaults import AUTO_DRAFTER, resolve_auto_defaults
from specexec.executor.engine.speculation.speculative_config import SpeculativeConfig
from specexec.executor.layers.quantized.auto_scheme import auto_scheme
from tiny_models import make_tiny_model


@pytest.fixture
def gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


@pytest.mark.parametrize(
    ("dtype", "device", "device_map", "expected"),
    [
        ("auto", "cpu", None, "gguf"),
        ("bfloat16", "cpu", None, "gguf"),
        ("float32", "cpu", None, "gguf"),
        ("float64", "cpu", None, None),  # the reference dtype: dequantized
        ("auto", "cuda", None, "gguf"),  # (auto is bfloat16 there)
        ("float16", "cuda:0", None, None),  # CUDA's int4 kernels run in bfloat16 only
        ("auto", "cpu", "auto", None),  # spread over devices: codes run on one
    ],
)
def test_a_gguf_runs_at_its_codes_where_its_kernels_run(gguf_file, dtype, device, device_map, expected):
    scheme, reason = auto_scheme(gguf_file, dtype, device, device_map)
    assert scheme == expected
    assert reason.startswith(f"{expected or 'none'}: auto: ")


def test_a_dense_checkpoint_or_a_missing_path_stays_as_loaded(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert auto_scheme(tmp_path, "auto", "cpu", None)[0] is None
    assert auto_scheme(tmp_path / "missing.gguf", "auto", "cpu", None)[0] is None


def test_the_config_passed_in_keeps_its_auto_values(gguf_file):
    config = ExecutorConfig(model=str(gguf_file))
    resolved, choices = resolve_auto_defaults(None, config, has_drafter=False)
    assert config.quantization == "auto" and config.speculative_config == "auto"
    assert resolved.quantization == "gguf"
    assert isinstance(resolved.speculative_config, SpeculativeConfig)
    assert resolved.speculative_config.decoding_type == AUTO_DRAFTER
    assert resolved.speculative_config.draft_len_policy == "auto"
    assert "auto" in choices.quantization and AUTO_DRAFTER in choices.speculation


@pytest.mark.parametrize("off", ["none", None])
def test_none_turns_either_off_and_a_drafter_passed_in_is_used_as_it_is(gguf_file, off):
    config = ExecutorConfig(model=str(gguf_file), quantization=off, speculative_config=off)
    resolved, choices = resolve_auto_defaults(None, config, has_drafter=False)
    assert resolved.quantization is None and resolved.speculative_config is None
    assert (
        choices.summary()
        == "quantization none: configured; drafter off: configured (speculative_config: none)"
    )
    resolved, _ = resolve_auto_defaults(None, ExecutorConfig(model=str(gguf_file)), has_drafter=True)
    assert resolved.speculative_config is None


def test_yaml_takes_auto_and_none(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("quantization: none\nspeculative_config: none\n")
    config = ExecutorConfig.from_yaml(path)
    assert config.quantization is None and config.speculative_config is None
    path.write_text("speculative_config: auto\n")
    assert ExecutorConfig.from_yaml(path).speculative_config == "auto"
    path.write_text("speculative_config: sometimes\n")
    with pytest.raises(ValueError, match="speculative_config"):
        ExecutorConfig.from_yaml(path)


def test_the_default_drafts_and_gives_the_tokens_of_plain_decoding():
    """float64 tiny Llama: a repetitive prompt, greedy, the default config against speculative none."""
    _, model = make_tiny_model("llama")
    prompt = [5, 6, 7, 8, 9] * 6
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    outputs = {}
    for spec in ("auto", None):
        config = ExecutorConfig(num_kv_blocks=64, block_size=4, dtype="float64", speculative_config=spec)
        with Executor(model, config) as executor:
            (out,) = executor.run([Request(prompt, params)])
            outputs[spec] = out
            if spec == "auto":
                assert executor.setup.auto_choices.speculation.startswith(AUTO_DRAFTER)
                assert executor.config.speculative_config.decoding_type == AUTO_DRAFTER
    assert outputs["auto"].token_ids == outputs[None].token_ids
    assert outputs["auto"].metrics.num_forwards < len(outputs["auto"].token_ids), "the default did not draft"
    assert outputs[None].metrics.num_forwards == len(outputs[None].token_ids)
