"""What an executor's start-up chose and measured, and why: one report the front holds
(`Executor.setup`), written once by set-up and never read by the engine."""

from __future__ import annotations

from dataclasses import dataclass, field

from .kernel_plan.dtype import DtypeChoice


@dataclass(slots=True)
class SetupReport:
    #: the dtype the model runs in, and why (``dtype: auto`` measures this machine once)
    dtype_choice: DtypeChoice
    #: what ``quantization`` made of the target's layers (a `QuantizationReport`), or None
    quantization: object = None
    #: which forward runs the target (``model_impl``): a `ModelImplChoice`, ``.impl`` specexec or transformers
    model_impl: object = None
    #: every kernel choice (`executor/kernel_plan/plan.py`); ``.layers(executor.model)``: what runs each layer
    kernel_plan: object = None
    #: what capturing each model's CUDA graphs took (`GraphCaptureReport` per model; empty off CUDA)
    cuda_graphs: list = field(default_factory=list)
    #: the config's ``auto`` answers (quantization, speculation) and why (`auto_defaults.AutoChoices`)
    auto_choices: object = None
    #: seconds the start-up warm-up took (``warmup: true``), else None
    warmup_seconds: float | None = None

    @property
    def linear_backend(self):
        """``cpu_linear``'s answer (blas or onednn) and why."""
        return self.kernel_plan.linear_backend

    @property
    def quantized_kernel(self):
        """``quantized_kernel``'s answer (torch or int8_dot, up to which rows) and why."""
        return self.kernel_plan.quantized_kernel
