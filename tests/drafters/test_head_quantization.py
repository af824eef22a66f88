"""EAGLE-3's ``head_quantization``: the choice (measured, cached, with its margin and the activation dtype
it found fastest), the head it builds (int8 layers, the target's embeddings untouched) and an executor
drafting with it (greedy output equal to no drafts, pages free)."""

from __future__ import annotations

import pytest
import torch
from eagle3_heads import eagle_spec, make_head_dir
from factories import assert_all_pages_free, drafting_config, greedy_requests
from specexec.drafters.eagle3.head import load_head
from specexec.executor.executor import Executor
from specexec.executor.kernel_plan import head_quantization
from specexec.executor.kernel_plan.head_quantization import (
    HeadQuantization,
    apply_head_quantization,
    choose_head_quantization,
)
from specexec.executor.layers.quantized.quantized_linear import Int8WeightOnlyLinear
from speculative_runs import BATCHES, MAX_TOKENS, num_drafted
from tiny_models import make_tiny_model

CPU = torch.device("cpu")


def tiny_head(tmp_path, dtype=torch.float32):
    make_head_dir(tmp_path)
    _, model = make_tiny_model("llama", dtype=dtype)
    return load_head(tmp_path, model.get_input_embeddings(), dtype, CPU), model


def fake_times(monkeypatch, int8_fp32: float, int8_bf16: float, dense: float = 1.0) -> list:
    """Replace the measurement by fixed seconds; returns the shapes each measurement was asked for."""
    asked = []

    def measure(shapes, dtype):
        asked.append(shapes)
        return {str(dtype): dense, "int8 torch.float32": int8_fp32, "int8 torch.bfloat16": int8_bf16}

    monkeypatch.setattr(head_quantization, "measure_head_linears", measure)
    return asked


@pytest.mark.parametrize(
    ("int8_fp32", "int8_bf16", "expected"),
    [
        (7.7, 0.64, ("int8", torch.bfloat16)),  # the Xeon of 2026-11-27
        (0.7, 3.0, ("int8", torch.float32)),
        (0.85, 0.9, (None, torch.float32)),  # faster, but not by the margin
        (9.0, 30.0, (None, torch.float32)),  # an AVX2-only CPU's bfloat16
    ],
)
def test_auto_takes_int8_in_the_fastest_activation_dtype_only_where_clearly_faster(
    tmp_path, monkeypatch, int8_fp32, int8_bf16, expected
):
    head, _ = tiny_head(tmp_path / "head")
    fake_times(monkeypatch, int8_fp32, int8_bf16)
    choice = choose_head_quantization("auto", head, CPU, tmp_path / "cache")
    assert (choice.scheme, choice.dtype) == expected
    assert "took" in choice.reason


def test_int8_is_taken_as_asked_and_null_keeps_the_head_as_loaded(tmp_path, monkeypatch):
    head, _ = tiny_head(tmp_path / "head")
    fake_times(monkeypatch, 9.0, 30.0)
    choice = choose_head_quantization("int8", head, CPU, None)
    assert (choice.scheme, choice.dtype) == ("int8", torch.float32)  # the faster of the two int8s
    assert choose_head_quantization(None, head, CPU, None) == HeadQuantization(
        None, torch.float32, "head_quantization: null"
    )


def test_auto_keeps_a_float64_head_dense_without_measuring(tmp_path, monkeypatch):
    head, _ = tiny_head(tmp_path / "head", torch.float64)
    asked = fake_times(monkeypatch, 0.1, 0.1)
    assert choose_head_quantization("auto", head, CPU, None).scheme is None
    assert asked == []


def test_the_measurement_runs_on_the_heads_own_layers_and_is_cached(tmp_path, monkeypatch):
    head, _ = tiny_head(tmp_path / "head")
    asked = fake_times(monkeypatch, 7.7, 0.5)
    for _ in range(2):
        choose_head_quantization("auto", head, CPU, tmp_path / "cache")
    linears = [m for m in head.modules() if type(m) is torch.nn.Linear]
    assert asked == [tuple((m.out_features, m.in_features) for m in linears)]


def test_the_real_measurement_times_dense_and_both_int8_forms():
    times = head_quantization.measure_head_linears(((32, 16), (64, 32)), torch.float32, repeats=1)
    assert set(times) == {"torch.float32", "int8 torch.float32", "int8 torch.bfloat16"}
    assert all(t > 0 for t in times.values())


def test_an_int8_head_has_int8_layers_in_its_dtype_and_leaves_the_targets_embeddings(tmp_path):
    head, model = tiny_head(tmp_path / "head")
    embeddings = model.get_input_embeddings()
    apply_head_quantization(head, HeadQuantization("int8", torch.bfloat16, "test"))
    layers = [m for m in head.modules() if isinstance(m, torch.nn.Linear | Int8WeightOnlyLinear)]
    assert layers and all(isinstance(m, Int8WeightOnlyLinear) for m in layers)
    assert head.dtype == torch.bfloat16
    assert embeddings.weight.dtype == torch.float32 and head.embed(torch.tensor([1])).dtype == torch.float32


def test_a_bad_setting_is_refused(tmp_path):
    make_head_dir(tmp_path)
    _, model = make_tiny_model("llama", dtype=torch.float32)
    spec = {**eagle_spec(tmp_path), "head_quantization": "int3"}
    with pytest.raises(ValueError, match="head_quantization"):
        Executor(model, drafting_config(dtype="float32", speculative_config=spec))


@pytest.mark.parametrize("batch", ["batch1", "batch8"])
def test_an_executor_drafting_with_an_int8_head_outputs_what_it_outputs_without_drafts(tmp_path, batch):
    """A float32 target, its head int8 in bfloat16: the drafts change, the greedy output does not."""
    make_head_dir(tmp_path)
    _, model = make_tiny_model("llama", dtype=torch.float32)
    with Executor(model, drafting_config(dtype="float32", cpu_linear="blas")) as plain:
        expected = [o.token_ids for o in plain.run(greedy_requests(BATCHES[batch], MAX_TOKENS))]
    spec = {**eagle_spec(tmp_path), "head_quantization": "int8"}
    with Executor(
        model, drafting_config(dtype="float32", cpu_linear="blas", speculative_config=spec)
    ) as executor:
        drafter = executor.speculation.drafter
        assert drafter.head_quantization.scheme == "int8"
        assert isinstance(drafter.head.lm_head, Int8WeightOnlyLinear)
        assert drafter.inputs.kv_cache.spec.dtype == drafter.head.dtype
        outputs = executor.run(greedy_requests(BATCHES[batch], MAX_TOKENS))
        assert [o.token_ids for o in outputs] == expected
        assert num_drafted(outputs) > 0
        assert_all_pages_free(executor)
