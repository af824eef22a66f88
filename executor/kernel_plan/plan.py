"""Every kernel decision of one executor, made and applied in one place, each measured through the one
measurement store (`measurement/store.py`: keyed by CPU, ISA, torch, threads, kernel build and shape).

| choice | picks | for | module |
|---|---|---|---|
| ``dtype`` | bfloat16 or float32 | the target's (and a self-draft's) weights and activations, on CPU | `dtype.py` |
| attention paths | the C++ paged kernel, SDPA or matmuls, by queries and keys | attention, per head shape | `attention_path.py` |
| ``cpu_linear`` | oneDNN packed, MKL packed or BLAS, by row band | dense linear layers on CPU | `dense_backend.py` |
| ``quantized_kernel`` | int8_dot or torch's kernels, up to a row count per scheme | quantized layers on CPU | `quantized_kernel.py` |
| skinny GEMM | the Triton skinny kernel or cuBLAS, by rows | the own decoder's projections on CUDA | `skinny_gemm.py` |
| forward cost | seconds of a forward over n tokens and of b-sequence decode steps | the draft-length policy | `forward_cost.py` |
| EAGLE-3 head | int8 or dense | the head's linear layers | `head_quantization.py` |

The dtype is chosen before loading (the model loads in it) and the EAGLE-3 head's weights when its
drafter is built; `plan_kernels` makes the others in one pass after the drafter is built (a drafter
that copies the target copies it dense): the attention paths per head shape, the dense backend once
for the target's shape, then each model (the target, the drafter's) is set up in turn for both
(packed for oneDNN where chosen, its quantized layers routed to int8_dot up to their rows), then the
skinny GEMM on CUDA. The forward cost is measured last, by the speculation stage, once the CUDA graphs
are captured (`KernelPlan.forward_cost`). `KernelPlan.layers` lists what runs every linear layer.

Measuring is bounded (`measurement/budget.py`): past the start's budget, or while other work takes the
CPUs, a choice with nothing stored takes this ISA's static default (`static_defaults.py`), says so,
and is measured at the next quiet start or by `specexec tune`.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from torch import nn

from ...drafters.base import Drafter
from ..config import ExecutorConfig
from ..engine.guided import MAX_FORCED_TOKENS
from ..engine.speculation.draft_length import ForwardCostModel
from ..layers.cpu_info import available_memory_bytes
from ..layers.measurement.cache_folder import resolve_cache_dir
from ..layers.packed_linear import PackedLinear, pack_linears, packable_linear_bytes, unpack_linears
from ..layers.quantized.quantized_dot import MAX_ROWS
from ..layers.quantized.quantized_linear import WeightOnlyLinear
from ..model.attention_paths import AttentionPaths
from ..model.model_runner import ModelRunner
from .attention_path import choose_attention_paths
from .dense_backend import LinearBackendChoice, choose_linear_backend, fit_in_memory
from .dtype import DtypeChoice
from .quantized_kernel import QuantizedKernelChoice, choose_quantized_kernel, set_int8_dot
from .skinny_gemm import SkinnyChoice, choose_skinny_kernels

logger = logging.getLogger("specexec")


@dataclass(slots=True)
class KernelPlan:
    dtype: DtypeChoice  #: the dtype the target loaded in, and why
    attention_paths: AttentionPaths  #: which attention kernel runs each kind of short-query group
    linear_backend: LinearBackendChoice  #: which kernels run the dense linear layers (CPU)
    quantized_kernel: QuantizedKernelChoice  #: which kernels run the quantized ones (CPU), up to which rows
    skinny_kernels: SkinnyChoice  #: which projections run the skinny-GEMM kernel (CUDA)
    #: the target's forward cost, where the draft-length policy measured it (set by the speculation stage)
    forward_cost: ForwardCostModel | None = None

    @staticmethod
    def layers(model: nn.Module) -> list[tuple[str, str]]:
        """(module name, what runs it) for every linear layer of ``model``, as the plan left it."""
        return [(name, runs) for name, layer in model.named_modules() if (runs := _runs(layer))]

    @classmethod
    def summary(cls, model: nn.Module) -> str:
        """One line: how many linear layers each kernel runs."""
        counts = Counter(runs for _, runs in cls.layers(model))
        return "; ".join(f"{n} x {runs}" for runs, n in counts.most_common())


def _runs(layer: nn.Module) -> str:
    if isinstance(layer, PackedLinear):
        return f"packed ({layer.describe_kernels()})"
    if isinstance(layer, WeightOnlyLinear):
        rows = layer.int8_dot_rows
        where = "every call" if rows >= MAX_ROWS else f"up to {rows} rows, torch above" if rows else None
        return f"{type(layer).__name__}: " + (f"int8_dot for {where}" if where else "torch's kernel")
    if type(layer) is nn.Linear:
        return "torch's matmul (BLAS)"
    return ""


def plan_kernels(
    config: ExecutorConfig, model: nn.Module, runner: ModelRunner, drafter: Drafter | None, dtype: DtypeChoice
) -> KernelPlan:
    """Choose the attention paths, the dense and quantized kernels and the skinny GEMM, and set the
    target and the drafter's models up for them in one pass (see the module docstring)."""
    runner.attention_paths = _attention_paths(config, model, runner)
    drafter_models = _drafter_modules(drafter)
    for module in (model, *drafter_models):  # as loaded, or as an earlier executor packed them
        unpack_linears(module)
    dense = _dense_backend(config, model, drafter_models, drafter)
    quantized = None
    for i, module in enumerate((model, *drafter_models)):
        _pack(module, dense, is_target=i == 0)
        choice = route_quantized_layers(config, module)
        quantized = quantized or choice  # the target's
    skinny = _skinny_kernels(config, runner, drafter)
    return KernelPlan(dtype, runner.attention_paths, dense, quantized, skinny)


def _attention_paths(config: ExecutorConfig, model: nn.Module, runner: ModelRunner) -> AttentionPaths:
    """The measured paths at the KV cache's head shape; tensor-parallel ranks keep their runner's."""
    if config.tensor_parallel_size > 1:
        return runner.attention_paths
    spec = runner.kv_cache.spec  # (the pool's own head shape and dtype)
    return choose_attention_paths(
        model.config.get_text_config().num_attention_heads,
        spec.num_kv_heads,
        spec.head_dim,
        spec.dtype,
        next(model.parameters()).device,
        resolve_cache_dir(config.cache_dir),
    )


def _drafter_modules(drafter: Drafter | None) -> list:
    if drafter is None:
        return []
    try:
        return list(drafter.torch_modules())
    except Exception:  # a plugin's hook: its models stay as they are
        logger.exception("kernel plan: %s.torch_modules() raised", type(drafter).__name__)
        return []


def _dense_backend(config: ExecutorConfig, model, drafter_models: list, drafter) -> LinearBackendChoice:
    """``cpu_linear``'s backend, measured at the target's shape (the models unpacked)."""
    if config.tensor_parallel_size > 1:  # each rank runs its shard on torch's ops
        return LinearBackendChoice("blas", "tensor parallelism: the ranks' shards run torch's ops")
    param = next(model.parameters())
    packable = any(packable_linear_bytes(m) for m in (model, *drafter_models))
    if config.cpu_linear == "auto" and param.device.type == "cpu" and not packable:
        # nothing the choice could pack: no measurement (a quantized model starts ~10 s sooner here)
        reason = "auto: no dense linear layer oneDNN could pack (quantized, or a dtype it does not pack)"
        return LinearBackendChoice("blas", reason)
    choice = choose_linear_backend(
        config.cpu_linear,
        param.device,
        param.dtype,
        model.config.get_text_config().to_dict(),
        resolve_cache_dir(config.cache_dir),
        config.quantization,
        None if drafter is None else 1 + drafter.max_draft_len,
    )
    return fit_in_memory(choice, packable_linear_bytes(model), available_memory_bytes())


def _pack(module: nn.Module, choice: LinearBackendChoice, is_target: bool) -> None:
    """Pack ``module``'s dense linear layers for the chosen backend: oneDNN (all rows or some) for the
    target and the drafter's models, MKL's packed GEMM for the target only (the drafter's verify is
    not the target's); BLAS packs nothing."""
    if choice.backend == "blas":
        return
    if is_target:
        packed = pack_linears(module, choice.bands, choice.mkl_rows)
    elif choice.bands is None or any(choice.bands.is_onednn):
        packed = pack_linears(module, choice.bands)
    else:
        return
    logger.info(
        "cpu_linear %s: %d linear layers of %s packed (%s)",
        choice.backend, packed, type(module).__name__, choice.reason,
    )  # fmt: skip


def route_quantized_layers(config: ExecutorConfig, module: nn.Module) -> QuantizedKernelChoice:
    """Choose ``quantized_kernel``'s kernel for ``module``'s quantized layers (measured per shape: a
    self-draft's int8 layers apart from the target's) and route them to it (a model an earlier executor
    set up is set again). Tensor-parallel ranks call it on their shards."""
    set_int8_dot([module], None)
    choice = choose_quantized_kernel(config.quantized_kernel, module, resolve_cache_dir(config.cache_dir))
    if choice.kernel == "int8_dot":
        layers = set_int8_dot([module], choice)
        logger.info(
            "quantized_kernel int8_dot: %d layers of %s (%s)", layers, type(module).__name__, choice.reason
        )
    return choice


def _skinny_kernels(config: ExecutorConfig, runner: ModelRunner, drafter: Drafter | None) -> SkinnyChoice:
    """On CUDA, the own decoder's projections over a decode or verify step's rows: the skinny-GEMM
    kernel where it measures faster than cuBLAS."""
    if runner.decoder is None:
        return SkinnyChoice("off", "transformers' modules run the target")
    max_draft_len = drafter.max_draft_len if drafter is not None else 0
    max_rows = min(config.max_num_tokens, config.max_batch_size * (1 + max(max_draft_len, MAX_FORCED_TOKENS)))
    choice = choose_skinny_kernels(runner.model, max_rows)
    if choice.kernel != "off":
        logger.info("skinny GEMM: %s", choice.reason)
    return choice
