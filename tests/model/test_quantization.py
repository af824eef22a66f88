"""Weight-only quantization: the layers against their own dequantized weights, the settings and their
errors, and speculation on a quantized target (greedy identity on float64 tiny models)."""

from __future__ import annotations

import pytest
import torch
from factories import assert_all_pages_free, drafting_config, greedy_requests
from quantized_weights import random_linear
from specexec.drafters.draft_target.quantized_copy import has_quantized_layers
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.speculation.speculative_config import SpeculativeConfig
from specexec.executor.executor import Executor
from specexec.executor.layers.quantized.gguf_weights import match_rows
from specexec.executor.layers.quantized.int4_layout import cpu_layout_matches, cuda_inner_k_tiles, unpack_int4
from specexec.executor.layers.quantized.quantization import quantize_model
from specexec.executor.layers.quantized.quantized_linear import (
    DENSE_FROM_ROWS,
    Int4WeightOnlyLinear,
    Int4Weights,
    Int8WeightOnlyLinear,
    QuantizationError,
    check_kernel,
)
from speculative_runs import BATCHES, MAX_TOKENS, num_accepted
from tiny_models import make_tiny_model

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ---- the layers -----------------------------------------------------------------------------------------


def test_int4_quantization_keeps_every_weight_within_half_a_step_of_its_group():
    weight = random_linear().weight
    q = Int4Weights.quantize(weight)
    assert q.q.dtype == torch.uint8 and int(q.q.max()) <= 15
    step = q.scale.repeat_interleave(32, dim=1)  # [out, in]
    assert torch.all((q.dequantize() - weight).abs() <= step / 2 + 1e-6)


@pytest.mark.parametrize("out_features", [48, 192])
def test_int4_packing_keeps_the_codes(out_features):
    layer = random_linear(out_features, 64)
    weights = Int4Weights.quantize(layer.weight)
    quantized = Int4WeightOnlyLinear(layer, weights)
    # the CPU layout's row blocks, where this CPU's int4 packing is the layout the fast path reads
    # (it differs by instruction set: on an AVX2-only CPU the dequantization always takes the kernel)
    assert quantized.can_dequantize_fast == (out_features % 64 == 0 and cpu_layout_matches())
    assert torch.equal(unpack_int4(quantized.packed, out_features, 64), weights.q)
    # equal up to one rounding (the kernel-free path fuses q * scale + offset)
    torch.testing.assert_close(
        quantized.dequantized(torch.float32), weights.dequantize(), rtol=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_prefill_sized_input_takes_the_dense_path_with_the_same_weights(scheme, dtype):
    layer = random_linear(128, 96).to(dtype)
    quantized = (Int8WeightOnlyLinear if scheme == "int8" else Int4WeightOnlyLinear)(layer)
    x = torch.randn(DENSE_FROM_ROWS, 96).to(dtype)
    kernel = torch.cat([quantized(x[:64]), quantized(x[64:])])  # below the threshold: the kernel
    dense = quantized(x)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert (dense.float() - kernel.float()).abs().max() <= tolerance * kernel.float().abs().max()


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_kernel_computes_with_the_layers_dequantized_weights(scheme, dtype):
    layer = random_linear(bias=True).to(dtype)
    quantized = (Int8WeightOnlyLinear if scheme == "int8" else Int4WeightOnlyLinear)(layer)
    x = torch.randn(3, 5, 96).to(dtype)
    got = quantized(x)  # [3, 5, 64]
    want = torch.nn.functional.linear(x.double(), quantized.dequantized(torch.float64), layer.bias.double())
    assert got.shape == (3, 5, 64) and got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bf16 / fp16 round the activations and scales
    assert (got.double() - want).abs().max() <= tolerance * want.abs().max()


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_float64_multiplies_by_exactly_the_dequantized_weights(scheme):
    layer = random_linear().double()
    quantized = (Int8WeightOnlyLinear if scheme == "int8" else Int4WeightOnlyLinear)(layer)
    x = torch.randn(4, 96, dtype=torch.float64)
    assert torch.equal(quantized(x), torch.nn.functional.linear(x, quantized.dequantized(torch.float64)))
    assert (quantized.dequantized(torch.float64) - layer.weight).abs().max() < 0.05


def test_int4_refuses_shapes_its_kernel_cannot_hold_and_the_model_takes_int8_there():
    with pytest.raises(QuantizationError, match="out_features by 16"):
        Int4WeightOnlyLinear(random_linear(out_features=40))
    model = torch.nn.Sequential(random_linear(64, 96), random_linear(40, 64))
    report = quantize_model(model, "int4")
    assert isinstance(model[0], Int4WeightOnlyLinear) and isinstance(model[1], Int8WeightOnlyLinear)
    assert report.layers == {"int4": 1, "int8 (shape not int4-able)": 1}
    assert "1 int4" in report.summary()


def test_a_layer_packed_for_one_device_refuses_another():
    quantized = Int4WeightOnlyLinear(random_linear())
    quantized.packed_for = "cuda"  # as if packed there: the CPU layout differs
    with pytest.raises(QuantizationError, match="packed for cuda"):
        quantized(torch.randn(1, 96))


def test_cuda_refuses_a_dtype_its_int4_kernel_does_not_take():
    with pytest.raises(QuantizationError, match="runs in bfloat16"):
        check_kernel("int4", torch.device("cuda"), torch.float32)


def test_match_rows_finds_a_reordering_and_refuses_anything_else():
    stored = torch.randn(8, 4)
    order = torch.tensor([3, 1, 0, 2, 7, 6, 5, 4])
    assert torch.equal(match_rows(stored, stored[order], "t"), order)
    assert torch.equal(match_rows(stored, stored.bfloat16()[order], "t"), order)
    with pytest.raises(QuantizationError, match="not a reordering"):
        match_rows(stored, stored[order] + 1e-3, "t")


# ---- settings ----------------------------------------------------------------------------------------


def test_match_rows_takes_a_negative_zero_for_a_zero():
    """A Q4_0 block with a negative scale and a code of 8: -0.0 in the converted copy, +0.0 in ours."""
    stored = torch.tensor([[0.0, 1.5, -2.0], [3.0, 0.0, 0.25]])
    converted = torch.tensor([[3.0, -0.0, 0.25], [-0.0, 1.5, -2.0]])
    assert torch.equal(match_rows(stored, converted, "t"), torch.tensor([1, 0]))
    assert torch.equal(match_rows(stored, converted.bfloat16(), "t"), torch.tensor([1, 0]))


def test_quantization_setting_is_checked_with_the_allowed_values():
    assert ExecutorConfig(quantization="int4").quantization == "int4"
    with pytest.raises(
        ValueError, match=r"'quantization': got 'q4_k'; allowed: auto, none, int8, int4, gguf"
    ):
        ExecutorConfig(quantization="q4_k")


def test_yaml_sets_quantization_for_the_target_and_the_draft(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "quantization: gguf\nspeculative_config:\n  decoding_type: DraftTarget\n  quantization: int4\n"
    )
    config = ExecutorConfig.from_yaml(path)
    assert config.quantization == "gguf"
    assert config.speculative_config.options == {"quantization": "int4"}


def test_draft_quantization_is_checked_before_loading_and_only_drafters_with_a_model_take_it():
    _, model = make_tiny_model("llama")
    bad = SpeculativeConfig.from_dict({"decoding_type": "DraftTarget", "quantization": "int2"})
    with pytest.raises(ValueError, match="'quantization': got 'int2'"):
        Executor(model, drafting_config(speculative_config=bad))
    ngram = SpeculativeConfig.from_dict({"decoding_type": "NGram", "quantization": "int8"})
    with pytest.raises(ValueError, match="quantization"):
        Executor(model, drafting_config(speculative_config=ngram))


def test_gguf_quantization_of_a_model_without_a_gguf_file_is_refused():
    _, model = make_tiny_model("llama")
    with pytest.raises(QuantizationError, match="needs a .gguf model"):
        Executor(model, drafting_config(quantization="gguf"))


# ---- speculation on a quantized target (float64: the dequantized weights, every drafter exact) ------------


def quantized_reference(arch, prompts, scheme):
    _, model = make_tiny_model(arch)
    executor = Executor(model, drafting_config(quantization=scheme))
    return [o.token_ids for o in executor.run(greedy_requests(prompts, MAX_TOKENS))]


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("drafter", ["ngram", "int8-self-draft", "int4-self-draft"])
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_speculation_on_a_quantized_target_keeps_its_greedy_output(scheme, drafter, batch):
    prompts = BATCHES[batch]
    if drafter == "ngram":
        spec = {"decoding_type": "NGram", "max_draft_len": 3}
    else:
        spec = {"decoding_type": "DraftTarget", "max_draft_len": 4, "quantization": drafter[:4]}
    _, model = make_tiny_model("llama")
    num_linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    executor = Executor(model, drafting_config(quantization=scheme, speculative_config=spec))
    assert (
        executor.setup.quantization is not None
        and sum(executor.setup.quantization.layers.values()) == num_linears
    )
    assert has_quantized_layers(executor.model)
    outputs = executor.run(greedy_requests(prompts, MAX_TOKENS))
    assert [o.token_ids for o in outputs] == quantized_reference("llama", prompts, scheme)
    assert num_accepted(outputs) > 0
    assert_all_pages_free(executor)


def test_quantized_output_differs_from_the_dense_model_so_the_identity_above_means_something():
    prompts = BATCHES["batch8"]
    _, model = make_tiny_model("llama")
    dense = [
        o.token_ids for o in Executor(model, drafting_config()).run(greedy_requests(prompts, MAX_TOKENS))
    ]
    assert dense != quantized_reference("llama", prompts, "int4")


def test_self_draft_takes_its_own_quantization():
    _, model = make_tiny_model("llama")
    spec = {"decoding_type": "DraftTarget", "max_draft_len": 3, "quantization": "int4"}
    executor = Executor(model, drafting_config(speculative_config=spec))
    draft = executor.speculation.drafter.runner.model
    kinds = {type(m) for m in draft.modules()}
    assert Int4WeightOnlyLinear in kinds and torch.nn.Linear not in kinds
    assert not has_quantized_layers(executor.model), "the target stays as loaded"


def test_self_draft_of_a_quantized_target_loaded_from_disk_is_loaded_again_at_its_own_setting(tmp_path):
    reference, _ = make_tiny_model("llama")
    reference.save_pretrained(tmp_path / "tiny")
    spec = {"decoding_type": "DraftTarget", "max_draft_len": 3, "quantization": "int4"}
    config = drafting_config(model=str(tmp_path / "tiny"), quantization="int8", speculative_config=spec)
    executor = Executor(config=config)
    target_kinds = {type(m) for m in executor.model.modules()}
    draft = executor.speculation.drafter.runner.model
    draft_kinds = {type(m) for m in draft.model.modules()}
    assert Int8WeightOnlyLinear in target_kinds and Int4WeightOnlyLinear not in target_kinds
    assert Int4WeightOnlyLinear in draft_kinds and Int8WeightOnlyLinear not in draft_kinds
    assert isinstance(draft.lm_head, Int8WeightOnlyLinear), "int4 keeps the LM head in int8"
    outputs = executor.run(greedy_requests(BATCHES["batch8"], MAX_TOKENS))
    assert [o.token_ids for o in outputs] == quantized_reference("llama", BATCHES["batch8"], "int8")
    assert_all_pages_free(executor)


# ---- CUDA (marked gpu: skipped where no CUDA device exists) ----------------------------------------------


def test_the_cuda_int4_packing_takes_the_largest_tiling_that_divides_the_layer():
    """tinygemm packs input features in multiples of 16 x its inner K tiles: 576 (SmolLM2's hidden
    size) and a tiny model's 64 or 96 do not divide into 128, the default tiling."""
    assert [cuda_inner_k_tiles(k) for k in (512, 1536, 576, 64, 96, 32)] == [8, 8, 4, 4, 2, 2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 4, DENSE_FROM_ROWS])
@pytest.mark.parametrize("in_features", [512, 576, 96])
def test_cuda_kernels_compute_with_the_layers_dequantized_weights(scheme, rows, in_features):
    check_kernel(scheme, torch.device("cuda"), torch.bfloat16)  # raises where torch has no kernel
    layer = random_linear(256, in_features).to("cuda", torch.bfloat16)
    quantized = (Int8WeightOnlyLinear if scheme == "int8" else Int4WeightOnlyLinear)(layer)
    x = torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16)
    want = torch.nn.functional.linear(x.double(), quantized.dequantized(torch.float64))
    assert (quantized(x).double() - want).abs().max() <= 2e-2 * want.abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_quantized_target_decodes_on_cuda_and_frees_its_pages(scheme):
    _, model = make_tiny_model("llama", dtype=torch.bfloat16)
    spec = {"decoding_type": "NGram", "max_draft_len": 3}
    config = drafting_config(dtype="bfloat16", device="cuda", quantization=scheme, speculative_config=spec)
    executor = Executor(model, config)
    outputs = executor.run(greedy_requests(BATCHES["batch8"], MAX_TOKENS))
    assert all(len(o.token_ids) == 16 and o.error is None for o in outputs)
    assert_all_pages_free(executor)


def test_the_command_line_sets_quantization_over_the_config(tmp_path):
    from specexec.cli import _build_parser
    from specexec.cli_config import load_config as _load_config

    config = tmp_path / "c.yaml"
    config.write_text("quantization: int8\n")
    args = _build_parser().parse_args(["run", "--prompt", "x", "--config", str(config)])
    assert _load_config(args).quantization == "int8"
    args = _build_parser().parse_args(
        ["run", "--prompt", "x", "--config", str(config), "--quantization", "none"]
    )
    assert _load_config(args).quantization is None
    args = _build_parser().parse_args(["run", "--prompt", "x", "--quantization", "gguf"])
    assert _load_config(args).quantization == "gguf"
    args = _build_parser().parse_args(["run", "--prompt", "x"])
    assert _load_config(args).quantization == "auto"  # the default: a GGUF at its codes


@pytest.mark.parametrize(("measured", "expected"), [("bfloat16", torch.bfloat16), ("float32", torch.float32)])
def test_a_float32_targets_self_draft_takes_the_dtype_measured_for_its_quantized_kernels(
    measured, expected, monkeypatch
):
    from specexec.executor.kernel_plan import dtype as dtype_choice

    asked = []

    def choose(device, shape, cache_dir, quantization=None, quantized_kernel="auto"):
        asked.append(quantization)
        return dtype_choice.DtypeChoice(measured, "test")

    monkeypatch.setattr(dtype_choice, "choose_dtype", choose)
    _, model = make_tiny_model("llama", dtype=torch.float32)
    spec = {"decoding_type": "DraftTarget", "max_draft_len": 3}
    executor = Executor(model, drafting_config(dtype="float32", speculative_config=spec))
    draft = executor.speculation.drafter.runner.model
    assert asked == ["int8"]
    assert (
        draft.model.norm.weight.dtype == expected and executor.model.model.norm.weight.dtype == torch.float32
    )
    outputs = executor.run(greedy_requests(BATCHES["batch1"], MAX_TOKENS))
    assert all(len(o.token_ids) == 16 for o in outputs)
    assert_all_pages_free(executor)


def test_a_self_draft_on_cuda_computes_in_a_dtype_its_kernels_take():
    """A float64 target's int8 self-draft on CUDA (the CUDA tests' setting) computes in float32, where
    the int8 kernel runs, instead of being refused; a dtype the kernels take, and the CPU, keep theirs."""
    from specexec.drafters.draft_target.self_draft import cuda_kernel_dtype

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert cuda_kernel_dtype(cuda, torch.float64, "int8") == "float32"
    assert cuda_kernel_dtype(cuda, torch.float32, "int4") == "bfloat16"
    assert cuda_kernel_dtype(cuda, torch.bfloat16, "int8") is None
    assert cuda_kernel_dtype(cpu, torch.float64, "int8") is None
    assert cuda_kernel_dtype(cuda, torch.float64, "gguf") == "bfloat16"  # (the int4 kernel)


def test_the_forward_cost_curve_is_cached_per_quantization():
    from specexec.executor.kernel_plan.forward_cost import cost_cache_key

    keys = set()
    for scheme in (None, "int8", "int4"):
        _, model = make_tiny_model("llama")
        if scheme:
            quantize_model(model, scheme)
        keys.add(cost_cache_key(model))
    assert len(keys) == 3, "a curve measured for one setting must not be reused for another"
