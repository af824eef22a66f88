"""``cpu_linear``: oneDNN's packed linear layers compute what ``F.linear`` computes (to float32 rounding),
pack only what they can run, survive copying, and the choice between them and the BLAS is measured
once, cached, and refused with a clear error where it cannot apply."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from eagle3_heads import eagle_spec, make_head_dir
from factories import assert_all_pages_free, drafting_config, greedy_requests
from specexec.drafters.base import Drafter, DraftProposal
from specexec.executor.executor import Executor
from specexec.executor.kernel_plan import dense_backend as linear_backend
from specexec.executor.kernel_plan.dense_backend import (
    MEASURED_ROWS,
    choice_from_ratios,
    choose_linear_backend,
    measure_onednn_ratios,
)
from specexec.executor.kernel_plan.dtype import ModelShape
from specexec.executor.layers.packed_linear import (
    PackedLinear,
    RowBands,
    can_pack,
    can_pack_mkl,
    pack_linears,
    unpack_linears,
)
from specexec.executor.layers.quantized.quantized_linear import Int8WeightOnlyLinear
from speculative_runs import BATCHES, MAX_TOKENS, num_drafted
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


@pytest.mark.parametrize("rows", [1, 3, 4, 7, 8, 40])
def test_a_banded_layer_runs_each_row_count_on_its_bands_kernel(monkeypatch, rows):
    dense = _linear(96, 80, bias=True)
    bands = RowBands((1, 4, 8), (False, True, False))
    banded, onednn_only = PackedLinear(dense, bands), PackedLinear(dense)
    blas_calls = []
    real_linear = F.linear
    monkeypatch.setattr(F, "linear", lambda *args: blas_calls.append(args) or real_linear(*args))
    x = torch.randn(rows, 96)  # [rows, in]
    out = banded(x)
    on_blas = not bands.uses_onednn(rows)
    assert len(blas_calls) == int(on_blas) and (rows in (4, 7)) != on_blas
    reference = real_linear(x, dense.weight, dense.bias) if on_blas else onednn_only(x)
    assert torch.equal(out, reference)
    torch.testing.assert_close(out, real_linear(x, dense.weight, dense.bias), rtol=1e-5, atol=1e-5)


def test_a_banded_layer_keeps_the_dense_tensor_itself_and_copies_to_its_own():
    dense = _linear(64, 48, bias=False)
    banded = PackedLinear(dense, RowBands((1, 2), (False, True)))
    assert banded.dense_weight.data_ptr() == dense.weight.data_ptr(), "the dense weight was copied"
    assert banded.to_linear().weight.data_ptr() == dense.weight.data_ptr(), "unpacking untied the weight"
    twin = copy.deepcopy(banded)
    assert twin.bands == banded.bands and twin.dense_weight.data_ptr() != dense.weight.data_ptr()
    assert torch.equal(twin.dense_weight, dense.weight)
    x = torch.randn(5, 64)
    torch.testing.assert_close(twin(x), banded(x), rtol=0, atol=0)


@pytest.mark.parametrize("starts, kernels", [((), ()), ((2, 4), (True, False)), ((1, 4, 4), (True,) * 3),
                                             ((1, 4), (True,))])  # fmt: skip
def test_malformed_row_bands_are_refused(starts, kernels):
    with pytest.raises(ValueError, match="row bands"):
        RowBands(starts, kernels)


needs_mkl = pytest.mark.skipif(not can_pack_mkl(torch.float32), reason="this torch build has no MKL")


@needs_mkl
@pytest.mark.parametrize("bands", [None, RowBands((1, 6), (False, True))])
@pytest.mark.parametrize("rows", [(1,), (4,), (2, 2), (5,), (7,)])
def test_a_layer_with_mkl_rows_runs_exactly_those_rows_on_mkls_packed_gemm(bands, rows):
    dense = _linear(96, 80, bias=True)
    layer = PackedLinear(dense, bands, mkl_rows=4)
    assert layer.dense_weight.data_ptr() == dense.weight.data_ptr()
    x = torch.randn(*rows, 96)  # [..., in]
    out = layer(x)
    assert out.shape == (*rows, 80)
    torch.testing.assert_close(out, F.linear(x, dense.weight, dense.bias), rtol=1e-5, atol=1e-5)
    if x.numel() // 96 == 4:
        packed = torch.ops.mkl._mkl_reorder_linear_weight(dense.weight, 4)
        expected = torch.ops.mkl._mkl_linear(x.reshape(4, 96), packed, dense.weight, dense.bias, 4)
        assert torch.equal(out.reshape(4, 80), expected)
    twin = copy.deepcopy(layer)
    assert twin.mkl_rows == 4 and twin.bands == bands and torch.equal(twin(x), out)


def test_mkl_rows_in_a_dtype_mkl_does_not_run_are_refused():
    with pytest.raises(ValueError, match="MKL"):
        PackedLinear(_linear(32, 32, bias=False, dtype=torch.bfloat16), RowBands((1,), (False,)), mkl_rows=4)


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


def _ratios(onednn_rows: set[int], fast: float = 0.6, slow: float = 1.2) -> dict[int, float]:
    return {n: fast if n in onednn_rows else slow for n in MEASURED_ROWS}


@pytest.mark.parametrize(
    "ratios, backend",
    [
        (_ratios(set(MEASURED_ROWS)), "onednn"),
        (_ratios(set()), "blas"),
        (_ratios(set(), slow=0.95), "blas"),  # within the margin: not clearly faster
        (_ratios({4, 6, 8, 12, 16}), "blas+onednn"),
    ],
)
def test_auto_keeps_onednn_only_where_measured_clearly_faster_and_measures_once(
    tmp_path, monkeypatch, ratios, backend
):
    calls = []

    def measure(shape, dtype, quantization):
        calls.append((shape, dtype, quantization))
        return ratios

    monkeypatch.setattr(linear_backend, "measure_onednn_ratios", measure)
    for _ in range(2):
        choice = choose_linear_backend("auto", CPU, torch.float32, TINY_SHAPE, tmp_path)
        assert choice.backend == backend and f"4: {ratios[4]:.2f}x" in choice.reason
        assert (choice.bands is not None) == (backend == "blas+onednn")
    assert len(calls) == 1, "the cached answer was measured again"
    choose_linear_backend("auto", CPU, torch.float32, TINY_SHAPE, tmp_path, quantization="int8")
    assert len(calls) == 2, "another quantization reused the float32 answer"


def test_onednn_takes_exactly_the_rows_it_won_up_to_the_next_measured_count():
    choice = choice_from_ratios(_ratios({4, 6, 8, 12, 16}))
    assert choice.backend == "blas+onednn"
    assert "oneDNN for 4-23 rows, the BLAS for 1-3, 24+" in choice.reason
    wins = [n for n in range(1, 300) if choice.bands.uses_onednn(n)]
    assert wins == list(range(4, 24))


def test_a_damaged_cached_answer_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setattr(linear_backend, "measure_onednn_ratios", lambda *args: _ratios({1}))
    choose_linear_backend("auto", CPU, torch.float32, TINY_SHAPE, tmp_path)
    (cached,) = tmp_path.glob("linear-backend-*.json")
    cached.write_text('{"onednn_ratios": {"one": "fast"}}')
    monkeypatch.setattr(linear_backend, "measure_onednn_ratios", lambda *args: _ratios(set(MEASURED_ROWS)))
    assert choose_linear_backend("auto", CPU, torch.float32, TINY_SHAPE, tmp_path).backend == "onednn"


@needs_mkl
@pytest.mark.parametrize(
    "onednn_rows, mkl_ratio, backend, against",
    [
        (set(), 0.7, "blas+mkl", "blas"),
        (set(MEASURED_ROWS), 0.7, "onednn+mkl", "onednn"),
        ({4, 6, 8}, 0.7, "blas+onednn+mkl", "onednn"),
        ({6, 8}, 0.7, "blas+onednn+mkl", "blas"),  # 4 rows: the BLAS's band
        ({4, 6, 8}, 0.97, "blas+onednn", "onednn"),  # within the margin
    ],
)
def test_auto_takes_mkls_packed_gemm_for_the_verify_rows_only_where_clearly_faster(
    tmp_path, monkeypatch, onednn_rows, mkl_ratio, backend, against
):
    calls = []

    def measure_mkl(shape, dtype, rows, other, quantization):
        calls.append((rows, other))
        return mkl_ratio

    monkeypatch.setattr(linear_backend, "measure_onednn_ratios", lambda *args: _ratios(onednn_rows))
    monkeypatch.setattr(linear_backend, "measure_mkl_ratio", measure_mkl)
    for _ in range(2):
        choice = choose_linear_backend("auto", CPU, torch.float32, TINY_SHAPE, tmp_path, verify_rows=4)
        assert choice.backend == backend and f"{mkl_ratio:.2f}x" in choice.reason
        assert choice.mkl_rows == (4 if backend.endswith("+mkl") else None)
        expected = choice_from_ratios(_ratios(onednn_rows)).bands
        if backend == "blas+mkl":
            expected = RowBands((1,), (False,))
        assert choice.bands == expected
    assert calls == [(4, against)], "measured against the wrong kernel, or not cached"
    no_drafter = choose_linear_backend("auto", CPU, torch.float32, TINY_SHAPE, tmp_path)
    assert no_drafter.mkl_rows is None and len(calls) == 1


@needs_mkl
def test_the_mkl_measurement_runs_on_the_models_shapes():
    for other in ("blas", "onednn"):
        ratio = linear_backend.measure_mkl_ratio(
            ModelShape.from_config(TINY_SHAPE), torch.float32, 4, other, repeats=1
        )
        assert 0 < ratio < 100


MIB = 2**20


@pytest.mark.parametrize(
    "backend, bands, mkl_rows, available_mib, kept, fewer",
    [
        ("blas+onednn+mkl", RowBands((1, 4), (False, True)), 4, None, "blas+onednn+mkl", ""),  # not known
        ("blas+onednn+mkl", RowBands((1, 4), (False, True)), 4, 400, "blas+onednn+mkl", ""),  # 200 <= 200
        ("blas+onednn+mkl", RowBands((1, 4), (False, True)), 4, 399, "blas+onednn", "2 more copies"),
        ("blas+onednn+mkl", RowBands((1, 4), (False, True)), 4, 150, "blas", "one kernel: blas"),
        ("blas+onednn", RowBands((1, 4), (True, False)), None, 150, "onednn", "one kernel: onednn"),
        ("onednn+mkl", None, 4, 150, "onednn", "MKL's packed GEMM dropped"),
        ("blas+mkl", RowBands((1,), (False,)), 4, 150, "blas", "MKL's packed GEMM dropped"),
        ("onednn", None, None, 1, "onednn", ""),  # no copy beyond one
    ],
)
def test_extra_weight_copies_are_kept_only_where_they_fit_in_memory(
    backend, bands, mkl_rows, available_mib, kept, fewer
):
    choice = linear_backend.LinearBackendChoice(backend, "auto: measured", bands, mkl_rows)
    available = None if available_mib is None else available_mib * MIB
    fitted = linear_backend.fit_in_memory(choice, 100 * MIB, available)
    assert fitted.backend == kept
    assert (fitted.mkl_rows is not None) == kept.endswith("+mkl")
    assert (fitted.bands is not None) == ("+" in kept)
    assert fewer in fitted.reason and (fitted == choice) == (fewer == "")


def test_the_executor_fits_its_kernels_to_the_memory_available(tmp_path, monkeypatch):
    make_head_dir(tmp_path)
    monkeypatch.setattr(linear_backend, "measure_onednn_ratios", lambda *args: _ratios({4, 6, 8}))
    monkeypatch.setattr(linear_backend, "measure_mkl_ratio", lambda *args: 0.5)
    from specexec.executor.kernel_plan import plan as kernel_plan

    monkeypatch.setattr(kernel_plan, "available_memory_bytes", lambda: 1)
    _, model = make_tiny_model("llama", dtype=torch.float32)
    config = drafting_config(
        dtype="float32", speculative_config=eagle_spec(tmp_path), cache_dir=str(tmp_path)
    )
    executor = Executor(model, config)
    assert (
        executor.setup.linear_backend.backend == "blas" and "not kept" in executor.setup.linear_backend.reason
    )
    assert _packed(executor.model) == 0
    outputs = executor.run(greedy_requests(BATCHES["batch1"], MAX_TOKENS))
    assert num_drafted(outputs) > 0
    assert_all_pages_free(executor)


def test_the_measurement_runs_both_backends_on_the_models_shapes():
    ratios = measure_onednn_ratios(ModelShape.from_config(TINY_SHAPE), torch.float32, repeats=1)
    assert sorted(ratios) == list(MEASURED_ROWS) and all(0 < r < 100 for r in ratios.values())


# ---- in the executor -------------------------------------------------------------------------------------


def dense_head_spec(head_dir) -> dict:
    """EAGLE-3 with its head's linear layers dense (not int8, whatever ``head_quantization: auto``
    measures on this machine), so that cpu_linear has them to pack."""
    return {**eagle_spec(head_dir), "head_quantization": None}


def _packed(module: torch.nn.Module) -> int:
    return sum(isinstance(m, PackedLinear) for m in module.modules())


def test_executor_on_onednn_drafts_and_outputs_what_it_outputs_on_blas(tmp_path):
    """float32 target and EAGLE-3 head, batch of 8: both models packed under onednn, none under blas,
    the same greedy tokens (sums in another order move logits by float32 rounding only)."""
    make_head_dir(tmp_path)
    tokens = {}
    for backend in ("blas", "onednn"):
        _, model = make_tiny_model("llama", dtype=torch.float32)
        config = drafting_config(
            dtype="float32", cpu_linear=backend, speculative_config=dense_head_spec(tmp_path)
        )
        executor = Executor(model, config)
        assert executor.setup.linear_backend.backend == backend
        head = executor.speculation.drafter.torch_modules()[0]
        assert (_packed(executor.model) > 0, _packed(head) > 0) == ((backend == "onednn",) * 2)
        outputs = executor.run(greedy_requests(BATCHES["batch8"], MAX_TOKENS))
        assert num_drafted(outputs) > 0
        assert_all_pages_free(executor)
        tokens[backend] = [o.token_ids for o in outputs]
    assert tokens["onednn"] == tokens["blas"]


def test_executor_on_row_bands_runs_decode_on_the_blas_and_verify_on_onednn(tmp_path, monkeypatch):
    """auto measured oneDNN faster at 2-23 rows only: float32 target and EAGLE-3 head keep both copies,
    one-row calls (decode, the head's drafting) go to the BLAS, verify rows to oneDNN, and the greedy
    tokens are the BLAS's."""
    make_head_dir(tmp_path)
    monkeypatch.setattr(
        linear_backend, "measure_onednn_ratios", lambda *args: _ratios({2, 3, 4, 6, 8, 12, 16})
    )
    monkeypatch.setattr(linear_backend, "measure_mkl_ratio", lambda *args: 1.0)  # not MKL's packed GEMM
    kernels_by_rows: dict[int, set[bool]] = {}
    decide = RowBands.uses_onednn

    def spy(self, num_rows):
        kernels_by_rows.setdefault(num_rows, set()).add(decide(self, num_rows))
        return decide(self, num_rows)

    monkeypatch.setattr(RowBands, "uses_onednn", spy)
    tokens = {}
    for backend in ("blas", "auto"):
        _, model = make_tiny_model("llama", dtype=torch.float32)
        spec = dense_head_spec(tmp_path)
        config = drafting_config(
            dtype="float32", cpu_linear=backend, speculative_config=spec, cache_dir=str(tmp_path)
        )
        executor = Executor(model, config)
        head = executor.speculation.drafter.torch_modules()[0]
        banded = [
            m for module in (executor.model, head) for m in module.modules() if isinstance(m, PackedLinear)
        ]
        assert (len(banded) > 0) == (backend == "auto")
        assert all(m.bands is not None and m.dense_weight is not None for m in banded)
        for batch in ("batch1", "batch8"):
            outputs = executor.run(greedy_requests(BATCHES[batch], MAX_TOKENS))
            assert num_drafted(outputs) > 0
            assert_all_pages_free(executor)
            tokens[backend, batch] = [o.token_ids for o in outputs]
    assert executor.setup.linear_backend.backend == "blas+onednn"
    assert {1, 4, 8} <= set(kernels_by_rows) and any(n >= 24 for n in kernels_by_rows), kernels_by_rows
    assert all(kernels == {2 <= n < 24} for n, kernels in kernels_by_rows.items()), kernels_by_rows
    assert all(tokens["auto", batch] == tokens["blas", batch] for batch in ("batch1", "batch8"))


@needs_mkl
def test_executor_runs_the_targets_verify_rows_on_mkls_packed_gemm(tmp_path, monkeypatch):
    """auto measured MKL's packed GEMM faster at 1 + k rows: the target's layers pack it (the head's
    do not), verify calls of batch 1 run on it, and the greedy tokens are the BLAS's."""
    make_head_dir(tmp_path)
    monkeypatch.setattr(linear_backend, "measure_onednn_ratios", lambda *args: _ratios(set()))
    monkeypatch.setattr(linear_backend, "measure_mkl_ratio", lambda *args: 0.5)
    spec = dense_head_spec(tmp_path)
    rows_seen = []
    real_mkl_linear = torch.ops.mkl._mkl_linear

    class _Spy:
        def __getattr__(self, name):
            if name == "_mkl_linear":
                return lambda x, *args: rows_seen.append(x.shape[0]) or real_mkl_linear(x, *args)
            return getattr(torch.ops.mkl, name)

    tokens = {}
    for backend in ("blas", "auto"):
        _, model = make_tiny_model("llama", dtype=torch.float32)
        config = drafting_config(
            dtype="float32", cpu_linear=backend, speculative_config=spec, cache_dir=str(tmp_path)
        )
        executor = Executor(model, config)
        head = executor.speculation.drafter.torch_modules()[0]
        target_layers = [m for m in executor.model.modules() if isinstance(m, PackedLinear)]
        assert _packed(head) == 0
        if backend == "auto":
            assert executor.setup.linear_backend.backend == "blas+mkl"
            k = executor.speculation.drafter.max_draft_len
            assert target_layers and all(m.mkl_rows == 1 + k and m.packed is None for m in target_layers)
            monkeypatch.setattr(torch.ops, "mkl", _Spy())
        for batch in ("batch1", "batch8"):
            outputs = executor.run(greedy_requests(BATCHES[batch], MAX_TOKENS))
            assert num_drafted(outputs) > 0
            assert_all_pages_free(executor)
            tokens[backend, batch] = [o.token_ids for o in outputs]
    assert rows_seen and set(rows_seen) == {1 + k}
    assert all(tokens["auto", batch] == tokens["blas", batch] for batch in ("batch1", "batch8"))


class _HidesItsModels(Drafter):
    """Drafts one fixed token; its torch_modules hook raises."""

    def propose(self, request, num_slots: int, resources) -> DraftProposal:
        return DraftProposal([7][:num_slots])

    def torch_modules(self):
        raise RuntimeError("no models to show")


def test_a_drafter_whose_torch_modules_raises_still_runs_on_a_packed_target(caplog):
    _, model = make_tiny_model("llama", dtype=torch.float32)
    executor = Executor(
        model, drafting_config(dtype="float32", cpu_linear="onednn"), drafter=_HidesItsModels(2)
    )
    assert _packed(executor.model) > 0
    assert "torch_modules() raised" in caplog.text
    outputs = executor.run(greedy_requests(BATCHES["batch1"], MAX_TOKENS))
    assert len(outputs[0].token_ids) == 16 and num_drafted(outputs) > 0
    assert_all_pages_free(executor)


def test_a_module_packed_by_one_executor_serves_the_next_on_blas_or_quantized():
    _, model = make_tiny_model("llama", dtype=torch.float32)
    request = BATCHES["batch1"]
    packed = Executor(model, drafting_config(dtype="float32", cpu_linear="onednn"))
    first = packed.run(greedy_requests(request, MAX_TOKENS))[0].token_ids
    assert _packed(model) > 0
    on_blas = Executor(model, drafting_config(dtype="float32", cpu_linear="blas"))
    assert _packed(model) == 0
    assert on_blas.run(greedy_requests(request, MAX_TOKENS))[0].token_ids == first
    Executor(model, drafting_config(dtype="float32", cpu_linear="onednn"))
    quantized = Executor(model, drafting_config(dtype="float32", cpu_linear="blas", quantization="int8"))
    assert _packed(model) == 0 and sum(isinstance(m, Int8WeightOnlyLinear) for m in model.modules()) > 0
    assert len(quantized.run(greedy_requests(request, MAX_TOKENS))[0].token_ids) == 16


def test_a_packed_module_is_dense_again_before_it_moves_to_the_configured_device(monkeypatch):
    """``module.to`` moves neither a `PackedLinear`'s packed copies nor the dense weight it keeps: on an
    H100 a model packed by a CPU executor, then given to a CUDA executor, kept CPU weights in its linears.
    The next executor unpacks the module before it moves it."""
    _, model = make_tiny_model("llama", dtype=torch.float32)
    Executor(model, drafting_config(dtype="float32", cpu_linear="onednn"))
    assert _packed(model) > 0
    packed_when_moved = []
    module_to = torch.nn.Module.to

    def recording_to(self, *args, **kwargs):
        if self is model:
            packed_when_moved.append(_packed(model))
        return module_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", recording_to)
    executor = Executor(model, drafting_config(dtype="float32", cpu_linear="blas", device="cpu"))
    assert packed_when_moved == [0]
    assert len(executor.run(greedy_requests(BATCHES["batch1"], MAX_TOKENS))[0].token_ids) == 16


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_model_with_no_dense_linear_layer_left_is_not_measured(scheme, tmp_path, monkeypatch):
    """Every linear layer quantized: nothing for oneDNN to pack, so `auto` measures nothing."""

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured oneDNN for a model it cannot pack")

    monkeypatch.setattr(linear_backend, "measure_onednn_ratios", no_measuring)
    _, model = make_tiny_model("llama", dtype=torch.float32)
    config = drafting_config(dtype="float32", quantization=scheme, cache_dir=str(tmp_path))
    executor = Executor(model, config)
    assert (
        executor.setup.linear_backend.backend == "blas"
        and "no dense linear layer" in executor.setup.linear_backend.reason
    )
    assert len(executor.run(greedy_requests(BATCHES["batch1"], MAX_TOKENS))[0].token_ids) == 16
