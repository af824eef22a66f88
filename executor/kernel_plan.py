"""Every kernel decision of one executor, made and applied in one place.

| decision | picks | for | measured and cached in |
|---|---|---|---|
| attention paths | the C++ paged kernel or SDPA, by queries and keys | attention, per head shape | `model/attention_paths.py` |
| ``cpu_linear`` | oneDNN packed, MKL packed or BLAS, by row band | dense linear layers on CPU | `layers/linear_backend.py` |
| ``quantized_kernel`` | int8_dot or torch's kernels, up to a row count per scheme | quantized layers on CPU | `layers/quantized/quantized_dot.py` |
| skinny GEMM | the Triton skinny kernel or cuBLAS, by rows | the own decoder's projections on CUDA | `layers/skinny_linear.py` |

The attention paths are chosen with the runner (`engine_setup.build_engine_core`); `plan_kernels` makes
the other three, in this order, on the target and on the drafter's models (after the drafter is built: a
drafter that copies the target copies it dense), applies them, and returns the `KernelPlan`. Each choice
is still measured by its own module, once per machine; `KernelPlan.layers` lists what runs every linear
layer, so one call shows every decision.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from torch import nn

from ..drafters.base import Drafter
from .config import ExecutorConfig
from .engine.guided import MAX_FORCED_TOKENS
from .layers.cpu_info import available_memory_bytes
from .layers.linear_backend import LinearBackendChoice, choose_linear_backend, fit_in_memory
from .layers.measurement.cache_folder import resolve_cache_dir
from .layers.packed_linear import PackedLinear, pack_linears, packable_linear_bytes, unpack_linears
from .layers.quantized.quantized_dot import (
    MAX_ROWS,
    QuantizedKernelChoice,
    choose_quantized_kernel,
    set_int8_dot,
)
from .layers.quantized.quantized_linear import WeightOnlyLinear
from .layers.skinny_linear import SkinnyChoice, choose_skinny_kernels
from .model.model_runner import ModelRunner

logger = logging.getLogger("specexec")


@dataclass(slots=True)
class KernelPlan:
    linear_backend: LinearBackendChoice  #: which kernels run the dense linear layers (CPU)
    quantized_kernel: QuantizedKernelChoice  #: which kernels run the quantized ones (CPU), up to which rows
    skinny_kernels: SkinnyChoice  #: which projections run the skinny-GEMM kernel (CUDA)

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
    config: ExecutorConfig, model: nn.Module, runner: ModelRunner, drafter: Drafter | None
) -> KernelPlan:
    """Choose and apply the dense, quantized and skinny kernels of the target and the drafter's models."""
    if config.tensor_parallel_size > 1:  # each rank runs its shard on torch's ops
        linear_backend = LinearBackendChoice("blas", "tensor parallelism: the ranks' shards run torch's ops")
    else:
        linear_backend = _apply_linear_backend(config, model, drafter)
    quantized_kernel = apply_quantized_kernel(config, model, drafter)
    return KernelPlan(linear_backend, quantized_kernel, _apply_skinny_kernels(config, runner, drafter))


def _drafter_modules(drafter: Drafter | None, what: str) -> list:
    if drafter is None:
        return []
    try:
        return list(drafter.torch_modules())
    except Exception:  # a plugin's hook: its models stay as they are
        logger.exception("%s: %s.torch_modules() raised", what, type(drafter).__name__)
        return []


def _apply_linear_backend(config: ExecutorConfig, model, drafter: Drafter | None) -> LinearBackendChoice:
    """Choose ``cpu_linear``'s backend and, for oneDNN (all rows or some), pack the target's and the
    drafter's dense linear layers in place, MKL's packed GEMM for the target only; for the BLAS, unpack
    those an earlier executor packed."""
    drafter_modules = _drafter_modules(drafter, "cpu_linear")
    for module in (model, *drafter_modules):  # as loaded, or as an earlier executor packed them
        unpack_linears(module)
    param = next(model.parameters())
    packable = any(packable_linear_bytes(m) for m in (model, *drafter_modules))
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
    choice = fit_in_memory(choice, packable_linear_bytes(model), available_memory_bytes())
    if choice.backend == "blas":
        return choice
    packed = pack_linears(model, choice.bands, choice.mkl_rows)
    if choice.bands is None or any(choice.bands.is_onednn):  # the drafter's verify is not the target's
        packed += sum(pack_linears(module, choice.bands) for module in drafter_modules)
    logger.info("cpu_linear %s: %d linear layers packed (%s)", choice.backend, packed, choice.reason)
    return choice


def apply_quantized_kernel(config: ExecutorConfig, model, drafter: Drafter | None) -> QuantizedKernelChoice:
    """Choose ``quantized_kernel``'s kernel for the target's quantized layers and, apart, for each of the
    drafter's models (a self-draft's int8 layers in the dtype its own measurement picked), and route
    their layers to it (a model an earlier executor set up is set again); returns the target's choice.
    Tensor-parallel ranks call it on their shards too."""
    cache_dir = resolve_cache_dir(config.cache_dir)
    choices = []
    for module in (model, *_drafter_modules(drafter, "quantized_kernel")):
        set_int8_dot([module], None)
        choice = choose_quantized_kernel(config.quantized_kernel, module, cache_dir)
        if choice.kernel == "int8_dot":
            layers = set_int8_dot([module], choice)
            logger.info(
                "quantized_kernel int8_dot: %d layers of %s (%s)",
                layers,
                type(module).__name__,
                choice.reason,
            )
        choices.append(choice)
    return choices[0]


def _apply_skinny_kernels(
    config: ExecutorConfig, runner: ModelRunner, drafter: Drafter | None
) -> SkinnyChoice:
    """On CUDA, the own decoder's projections over a decode or verify step's rows: the skinny-GEMM
    kernel where it measures faster than cuBLAS (`skinny_linear.py`)."""
    if runner.decoder is None:
        return SkinnyChoice("off", "transformers' modules run the target")
    max_draft_len = drafter.max_draft_len if drafter is not None else 0
    max_rows = min(config.max_num_tokens, config.max_batch_size * (1 + max(max_draft_len, MAX_FORCED_TOKENS)))
    choice = choose_skinny_kernels(runner.model, max_rows)
    if choice.kernel != "off":
        logger.info("skinny GEMM: %s", choice.reason)
    return choice
