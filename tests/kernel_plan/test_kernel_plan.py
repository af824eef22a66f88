"""The kernel plan (executor/kernel_plan.py): one place holds every kernel choice of an executor, and its
per-layer listing says what the choices left running each linear layer of the target and the drafter."""

from __future__ import annotations

import torch
from factories import drafting_config
from specexec.executor.executor import Executor
from specexec.executor.kernel_plan.plan import KernelPlan
from specexec.executor.layers.quantized.quantized_dot import MAX_ROWS
from tiny_models import make_tiny_model


def test_an_int8_dot_plan_lists_every_quantized_layer_on_it(cpu_ops_built):
    _, model = make_tiny_model("llama", dtype=torch.float32)
    config = drafting_config(dtype="float32", quantization="int4", quantized_kernel="int8_dot")
    with Executor(model, config) as executor:
        plan = executor.setup.kernel_plan
        assert isinstance(plan, KernelPlan)
        assert (
            executor.setup.quantized_kernel is plan.quantized_kernel
            and plan.quantized_kernel.kernel == "int8_dot"
        )
        assert executor.setup.linear_backend is plan.linear_backend
        layers = dict(plan.layers(executor.model))
        linears = [n for n, m in executor.model.named_modules() if hasattr(m, "in_features")]
        assert sorted(layers) == sorted(linears), "every linear layer listed, nothing else"
        assert set(layers.values()) == {
            "Int4WeightOnlyLinear: int8_dot for every call",
            "Int8WeightOnlyLinear: int8_dot for every call",  # the LM head
        }
        summary = plan.summary(executor.model)
        assert summary.startswith(f"{len(linears) - 1} x Int4WeightOnlyLinear: int8_dot for every call")


def test_a_plan_with_rows_up_to_a_count_and_torchs_kernel_say_so(cpu_ops_built):
    _, model = make_tiny_model("llama", dtype=torch.float32)
    with Executor(
        model, drafting_config(dtype="float32", quantization="int4", quantized_kernel="torch")
    ) as ex:
        assert set(dict(ex.setup.kernel_plan.layers(ex.model)).values()) == {
            "Int4WeightOnlyLinear: torch's kernel",
            "Int8WeightOnlyLinear: torch's kernel",
        }
        layer = next(m for m in ex.model.modules() if type(m).__name__ == "Int4WeightOnlyLinear")
        layer.set_int8_dot_rows(4)
        assert (
            "Int4WeightOnlyLinear: int8_dot for up to 4 rows, torch above"
            in dict(KernelPlan.layers(ex.model)).values()
        )
        layer.set_int8_dot_rows(MAX_ROWS)


def test_a_dense_float64_plan_runs_torchs_matmul_everywhere():
    _, model = make_tiny_model("llama")
    with Executor(
        model, drafting_config(speculative_config={"decoding_type": "NGram", "max_draft_len": 2})
    ) as ex:
        plan = ex.setup.kernel_plan
        assert plan.linear_backend.backend == "blas" and plan.quantized_kernel.kernel == "torch"
        assert plan.skinny_kernels.kernel == "off"
        assert set(dict(plan.layers(ex.model)).values()) == {"torch's matmul (BLAS)"}
