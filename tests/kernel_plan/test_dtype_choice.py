"""``dtype: auto``: bfloat16 on CUDA; float32 on a CPU without native bf16; on a CPU with it, what a
one-time measurement says (cached per machine and model shape). The peeked shapes come from the
model's config.json or GGUF header without loading weights."""

from __future__ import annotations

import math

import pytest
import torch
from specexec import Executor, ExecutorConfig
from specexec.executor.engine_setup import resolve_dtype
from specexec.executor.kernel_plan import dtype as dtype_choice
from specexec.executor.kernel_plan.dtype import Bf16Timing, ModelShape, choose_dtype, measure_bf16_ratio
from specexec.executor.model.model_peek import peek_max_position_embeddings, peek_text_config
from tiny_models import make_tiny_model, save_tiny_model_dir

CPU = torch.device("cpu")
TINY_SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.fixture
def measured(monkeypatch):
    """Replace the measurement with a fixed bf16/fp32 ratio (every turn's, unless ``turns``); counts the
    measurements."""
    calls = []

    def fake(ratio, turns=None):
        def measure(shape, quantization=None, int8_dot=False):
            calls.append((shape, quantization))
            return Bf16Timing(ratio, turns or (ratio,) * 3)

        monkeypatch.setattr(dtype_choice, "measure_bf16_ratio", measure)
        return calls

    return fake


def test_a_configured_dtype_is_kept():
    assert resolve_dtype(None, ExecutorConfig(dtype="float64")).dtype == "float64"


def test_cuda_gets_bfloat16_without_measuring(measured):
    calls = measured(0.1)
    choice = choose_dtype(torch.device("cuda"), TINY_SHAPE, None)
    assert (choice.dtype, calls) == ("bfloat16", [])
    assert "CUDA" in choice.reason


def test_a_cpu_without_native_bf16_gets_float32_without_measuring(measured, monkeypatch):
    calls = measured(0.1)
    monkeypatch.setattr(dtype_choice, "native_bf16_flags", lambda: [])
    choice = choose_dtype(CPU, TINY_SHAPE, None)
    assert (choice.dtype, calls) == ("float32", [])
    assert "no native bfloat16" in choice.reason


@pytest.mark.parametrize(("ratio", "expected"), [(0.5, "bfloat16"), (0.95, "float32"), (1.4, "float32")])
def test_a_cpu_with_native_bf16_follows_the_measurement_once(
    measured, monkeypatch, tmp_path, ratio, expected
):
    calls = measured(ratio)
    monkeypatch.setattr(dtype_choice, "native_bf16_flags", lambda: ["avx512_bf16"])
    first = choose_dtype(CPU, TINY_SHAPE, tmp_path)
    second = choose_dtype(CPU, TINY_SHAPE, tmp_path)
    assert first.dtype == second.dtype == expected
    assert f"{ratio:.2f}x" in first.reason
    assert len(calls) == 1, "the measurement is cached per machine and shape"
    assert len(list(tmp_path.glob("dtype-choice-*.json"))) == 1
    choose_dtype(CPU, {**TINY_SHAPE, "hidden_size": 64}, tmp_path)
    assert len(calls) == 2, "another model shape is measured again"
    assert choose_dtype(CPU, {}, tmp_path).dtype == "float32"  # shape unreadable: no measurement
    assert len(calls) == 2
    quantized = choose_dtype(CPU, TINY_SHAPE, tmp_path, "int4")
    assert len(calls) == 3 and calls[-1][1] == "int4", "quantized weights are measured on their own"
    assert "with int4 weights" in quantized.reason


@pytest.mark.parametrize("quantization", [None, "int8", "int4", "gguf"])
def test_the_measurement_runs_both_dtypes_and_gives_a_ratio(quantization):
    shape = ModelShape.from_config({**TINY_SHAPE, "num_hidden_layers": 2, "vocab_size": 256})
    timing = measure_bf16_ratio(shape, quantization, repeats=1)
    assert math.isfinite(timing.ratio) and timing.ratio > 0 and len(timing.turns) == 1


def test_bfloat16_is_taken_only_where_every_turn_found_it_under_the_margin(measured, monkeypatch, tmp_path):
    """A median under the margin with one turn above it is within the noise between turns: the
    documented default, float32, and the reason says why."""
    measured(0.8, turns=(0.7, 0.8, 0.95))
    monkeypatch.setattr(dtype_choice, "native_bf16_flags", lambda: ["avx512_bf16"])
    choice = choose_dtype(CPU, TINY_SHAPE, tmp_path)
    assert choice.dtype == "float32"
    assert "0.80x" in choice.reason and "0.70-0.95x over 3 turns" in choice.reason
    assert "not under 0.9x in every turn" in choice.reason
    measured(0.8, turns=(0.7, 0.8, 0.89))
    assert choose_dtype(CPU, TINY_SHAPE, tmp_path / "other").dtype == "bfloat16"


def test_shapes_are_peeked_from_a_model_directory_and_the_embedded_gguf(tmp_path):
    directory = save_tiny_model_dir(tmp_path)
    config = peek_text_config(directory)
    _, model = make_tiny_model("llama")
    assert config["hidden_size"] == model.config.hidden_size
    assert config["num_hidden_layers"] == model.config.num_hidden_layers
    gguf = peek_text_config(None)  # SmolLM2-135M's header, read up to its tokenizer
    assert (gguf["hidden_size"], gguf["num_hidden_layers"], gguf["num_key_value_heads"]) == (576, 30, 3)
    assert peek_max_position_embeddings(None) == 8192
    assert peek_text_config(tmp_path / "missing") == {}


def test_the_executor_reports_its_choice(tmp_path, measured, monkeypatch):
    measured(0.5)
    monkeypatch.setattr(dtype_choice, "native_bf16_flags", lambda: ["amx_bf16"])
    directory = save_tiny_model_dir(tmp_path / "model")
    config = ExecutorConfig(model=directory, device="cpu", num_kv_blocks=16, cache_dir=str(tmp_path))
    with Executor(config=config) as executor:
        assert executor.setup.dtype_choice.dtype == "bfloat16"
        assert next(executor.model.parameters()).dtype == torch.bfloat16
    _, module = make_tiny_model("llama")
    with Executor(module, ExecutorConfig(device="cpu", num_kv_blocks=16)) as executor:
        assert executor.setup.dtype_choice.dtype == "float64"  # a module keeps its own


@pytest.mark.parametrize(("bf16_seconds", "timed_again"), [(0.002, False), (0.012, True)])
def test_a_dtype_clearly_slower_at_its_warm_up_is_not_timed_again(bf16_seconds, timed_again, monkeypatch):
    import time

    calls = []

    class FakeStep:
        def __init__(self, shape, dtype, quantization=None, int8_dot=False):
            self.dtype = dtype

        def run(self, num_tokens):
            calls.append(self.dtype)
            time.sleep(0.016 if self.dtype == torch.float32 else bf16_seconds)

    monkeypatch.setattr(dtype_choice, "DecodeStepWork", FakeStep)
    timing = dtype_choice.measure_bf16_ratio(None, repeats=3)
    assert (len(calls) > 2) == timed_again, calls
    assert 0.05 < timing.ratio < (0.3 if not timed_again else 1.2)
    assert len(timing.turns) == (3 if timed_again else 1)
    if timed_again:  # the dtypes took turns: float32's 1 and 4 tokens, then bfloat16's, three times
        assert calls[2:] == ([torch.float32] * 2 + [torch.bfloat16] * 2) * 3


def test_quantized_weights_are_timed_on_the_kernel_quantized_kernel_allows(monkeypatch, tmp_path):
    """auto and int8_dot time the int8_dot kernels (built here), torch times torch's; the answers are
    cached apart."""
    from specexec.executor.layers import cpu_info
    from specexec.executor.layers.quantized.quantized_dot import MAX_ROWS

    asked = []

    def measure(shape, quantization=None, int8_dot=False):
        asked.append(int8_dot)
        return Bf16Timing(0.5, (0.5,))

    monkeypatch.setattr(dtype_choice, "measure_bf16_ratio", measure)
    monkeypatch.setattr(dtype_choice, "native_bf16_flags", lambda: ["avx512_bf16"])
    monkeypatch.setattr(cpu_info, "native_bf16_flags", lambda: ["avx512_bf16"])
    shape = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 128}
    for setting in ("auto", "torch", "int8_dot", "auto"):
        choose_dtype(torch.device("cpu"), shape, tmp_path, "int4", setting)
    assert asked == [True, False], "int8_dot shares auto's cached answer"
    work = dtype_choice.DecodeStepWork(ModelShape.from_config(shape), torch.float32, "int4", int8_dot=True)
    assert all(layer.int8_dot_rows == MAX_ROWS for group in work.layers for layer in group)
    work.run(2)


def test_a_gguf_step_is_timed_as_it_loads_the_q8_0_head_on_int8_dot_and_attends_over_pages():
    """Where int8_dot runs, a GGUF's Q8_0 head loads as int8 blocks in every dtype (`quantization.py`):
    timing a dense float32 head instead made float32 look twice as slow. Attention is the C++ kernel over
    pages, as decode and verify rows take it."""
    from specexec.executor.layers.quantized.q8_block_linear import Int8BlockLinear

    shape = ModelShape.from_config(
        {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 128}
    )
    for dtype in (torch.float32, torch.bfloat16):
        work = dtype_choice.DecodeStepWork(shape, dtype, "gguf", int8_dot=True)
        assert isinstance(work.head, Int8BlockLinear) and work.paged
        work.run(1)
        work.run(4)
    without = dtype_choice.DecodeStepWork(shape, torch.float32, "gguf", int8_dot=False)
    assert type(without.head) is torch.nn.Linear, "torch's kernels: the head stays dense in float32"
