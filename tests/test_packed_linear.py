"""``cpu_linear``: oneDNN's packed linear layers compute what ``F.linear`` computes (to float32 rounding),
pack only what they can run, survive copying, and the choice between them and the BLAS is measured
once, cached, and refused with a clear error where it cannot apply."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from specexec.drafters.base import Drafter, DraftProposal
from specexec.executor import linear_backend
from specexec.executor.dtype_choice import ModelShape
from specexec.executor.executor import Executor
from specexec.executor.linear_backend import choose_linear_backend, measure_onednn_ratio
from specexec.executor.packed_linear import PackedLinear, can_pack, pack_linears, unpack_linears
from specexec.executor.quantized_linear import Int8WeightOnlyLinear
from test_eagle3 import eagle_spec, make_head_dir
from test_speculative_identity import (
    BATCHES,
    assert_all_pages_free,
    make_config,
    make_requests,
    num_drafted,
)
from tiny_models import make_tiny_model

CPU = torch.device("cpu")
TINY_SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 8, "num_hidden_layers": 2, "vocab_size": 256}  # fmt: skip


def _linear(in_features: int, out_features: int, bias: bool, dtype=torch.float32) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(in_features, out_features, bias=bias, dtype=dtype).requires_grad_(False)


def test_float32_packs_and_float64_and_float16_do_not():
    assert can_pack(torch.float32)
    assert not can_pack(torch.float64)
    assert not can_pack(torch.float16)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [(1,), (4,), (2, 3), (0,)])
def test_packed_layer_computes_what_f_linear_computes(bias, rows):
    dense = _linear(96, 80, bias)
    packed = PackedLinear(dense)
    x = torch.randn(*rows, 96)  # [..., in]
    out = packed(x)
    assert out.shape == (*rows, 80)
    torch.testing.assert_close(out, F.linear(x, dense.weight, dense.bias), rtol=1e-5, atol=1e-5)


def test_packing_only_reorders_the_weight():
    dense = _linear(64, 48, bias=True)
    back = PackedLinear(dense).to_linear()
    assert torch.equal(back.weight, dense.weight) and torch.equal(back.bias, dense.bias)


def test_pack_linears_replaces_only_dense_layers_of_a_packable_dtype():
    model = torch.nn.Sequential(
        _linear(32, 32, bias=False),
        torch.nn.ReLU(),
        Int8WeightOnlyLinear(_linear(32, 32, bias=False)),
        _linear(32, 16, bias=True),
    )
    float64_model = torch.nn.Sequential(_linear(32, 32, bias=False, dtype=torch.float64))
    x = torch.randn(3, 32)
    before = model(x)
    assert pack_linears(model) == 2
    assert [type(m).__name__ for m in model] == [
        "PackedLinear",
        "ReLU",
        "Int8WeightOnlyLinear",
        "PackedLinear",
    ]
    torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-5)
    assert pack_linears(model) == 0, "an already packed layer is packed again"
    assert pack_linears(float64_model) == 0 and type(float64_model[0]) is torch.nn.Linear


def test_a_packed_model_deep_copies_and_unpacks_to_its_own_weights():
    model = torch.nn.Sequential(_linear(32, 24, bias=True))
    weight = model[0].weight.clone()
    pack_linears(model)
    twin = copy.deepcopy(model)
    assert twin[0].packed is not model[0].packed and twin[0].bias is not model[0].bias
    unpack_linears(twin)
    assert type(twin[0]) is torch.nn.Linear and torch.equal(twin[0].weight, weight)
    x = torch.randn(2, 32)
    torch.testing.assert_close(model(x), twin(x), rtol=1e-5, atol=1e-5)


# ---- the choice ------------------------------------------------------------------------------------------


def test_configured_backends_are_taken_as_given():
    assert choose_linear_backend("blas", CPU, torch.float32, TINY_SHAPE, None).backend == "blas"
    assert choose_linear_backend("onednn", CPU, torch.float32, TINY_SHAPE, None).backend == "onednn"


@pytest.mark.parametrize(
    "device, dtype",
    [(torch.device("cuda"), torch.float32), (CPU, torch.float64), (CPU, torch.float16)],
)
def test_onednn_where_it_cannot_run_is_refused_naming_the_key(device, dtype):
    with pytest.raises(ValueError, match="cpu_linear"):
        choose_linear_backend("onednn", device, dtype, TINY_SHAPE, None)
    choice = choose_linear_backend("auto", device, dtype, TINY_SHAPE, None)
    assert choice.backend == "blas" and "does not apply" in choice.reason


def test_an_unknown_setting_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="cpu_linear.*allowed: auto, blas, onednn"):
        choose_linear_backend("mkl", CPU, torch.float32, TINY_SHAPE, None)


@pytest.mark.parametrize("ratio, backend", [(0.6, "onednn"), (0.95, "blas"), (1.3, "blas")])
def test_auto_keeps_onednn_only_when_measured_clearly_faster_and_measures_once(
    tmp_path, monkeypatch, ratio, backend
):
    calls = []

    def measure(shape, dtype, quantization):
        calls.append((shape, dtype, quantization))
        return ratio

    monkeypatch.setattr(linear_backend, "measure_onednn_ratio", measure)
    for _ in range(2):
        choice = choose_linear_backend("auto", CPU, torch.float32, TINY_SHAPE, tmp_path)
        assert choice.backend == backend and f"{ratio:.2f}x" in choice.reason
    assert len(calls) == 1, "the cached answer was measured again"
    choose_linear_backend("auto", CPU, torch.float32, TINY_SHAPE, tmp_path, quantization="int8")
    assert len(calls) == 2, "another quantization reused the float32 answer"


def test_the_measurement_runs_both_backends_on_the_models_shapes():
    ratio = measure_onednn_ratio(ModelShape.from_config(TINY_SHAPE), torch.float32, repeats=1)
    assert 0 < ratio < 100


# ---- in the executor -------------------------------------------------------------------------------------


def _packed(module: torch.nn.Module) -> int:
    return sum(isinstance(m, PackedLinear) for m in module.modules())


def test_executor_on_onednn_drafts_and_outputs_what_it_outputs_on_blas(tmp_path):
    """float32 target and EAGLE-3 head, batch of 8: both models packed under onednn, none under blas,
    the same greedy tokens (sums in another order move logits by float32 rounding only)."""
    make_head_dir(tmp_path)
    tokens = {}
    for backend in ("blas", "onednn"):
        _, model = make_tiny_model("llama", dtype=torch.float32)
        config = make_config(dtype="float32", cpu_linear=backend, speculative_config=eagle_spec(tmp_path))
        executor = Executor(model, config)
        assert executor.linear_backend.backend == backend
        head = executor.speculation.drafter.torch_modules()[0]
        assert (_packed(executor.model) > 0, _packed(head) > 0) == ((backend == "onednn",) * 2)
        outputs = executor.run(make_requests(BATCHES["batch8"]))
        assert num_drafted(outputs) > 0
        assert_all_pages_free(executor)
        tokens[backend] = [o.token_ids for o in outputs]
    assert tokens["onednn"] == tokens["blas"]


class _HidesItsModels(Drafter):
    """Drafts one fixed token; its torch_modules hook raises."""

    def propose(self, request, num_slots: int, resources) -> DraftProposal:
        return DraftProposal([7][:num_slots])

    def torch_modules(self):
        raise RuntimeError("no models to show")


def test_a_drafter_whose_torch_modules_raises_still_runs_on_a_packed_target(caplog):
    _, model = make_tiny_model("llama", dtype=torch.float32)
    executor = Executor(model, make_config(dtype="float32", cpu_linear="onednn"), drafter=_HidesItsModels(2))
    assert _packed(executor.model) > 0
    assert "torch_modules() raised" in caplog.text
    outputs = executor.run(make_requests(BATCHES["batch1"]))
    assert len(outputs[0].token_ids) == 16 and num_drafted(outputs) > 0
    assert_all_pages_free(executor)


def test_a_module_packed_by_one_executor_serves_the_next_on_blas_or_quantized():
    _, model = make_tiny_model("llama", dtype=torch.float32)
    request = BATCHES["batch1"]
    packed = Executor(model, make_config(dtype="float32", cpu_linear="onednn"))
    first = packed.run(make_requests(request))[0].token_ids
    assert _packed(model) > 0
    on_blas = Executor(model, make_config(dtype="float32", cpu_linear="blas"))
    assert _packed(model) == 0
    assert on_blas.run(make_requests(request))[0].token_ids == first
    Executor(model, make_config(dtype="float32", cpu_linear="onednn"))
    quantized = Executor(model, make_config(dtype="float32", cpu_linear="blas", quantization="int8"))
    assert _packed(model) == 0 and sum(isinstance(m, Int8WeightOnlyLinear) for m in model.modules()) > 0
    assert len(quantized.run(make_requests(request))[0].token_ids) == 16
