"""What the two ``auto`` defaults become for one model, decided before it loads, each with its reason.

| key | auto becomes | why |
|---|---|---|
| ``quantization`` | ``gguf`` for a GGUF file where its int4 kernels run (the CPU in any dtype but float64; CUDA in bfloat16), else ``none`` (`layers/quantized/auto_scheme.py`) | a GGUF runs at its own codes, as llama.cpp runs it: TPOT 10-11 ms against 32 dequantized (SmolLM2's Q4_1, 2-core Sapphire Rapids) |
| ``speculative_config`` | Suffix decoding, up to `AUTO_MAX_DRAFT_LEN` drafts, under ``draft_len_policy: auto``, none from `AUTO_NO_DRAFTS_FROM_BATCH` running requests | the drafter the bench measured best for a model without a trained head (`bench/reports/2026-11-29-suffix-decoding/`), ahead of SmolLM2's shipped EAGLE-3 and Medusa heads too; the policy drafts only where this machine's measured forward cost says drafts pay |

``none`` (or null) turns either off. The executor keeps the resolved config (`Executor.config`) and the
reasons (`Executor.setup.auto_choices`), which `specexec run` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .config import ExecutorConfig
from .engine.speculation.speculative_config import SpeculativeConfig
from .engine_setup import resolve_device
from .layers.quantized.auto_scheme import auto_scheme

AUTO_DRAFTER = "Suffix"
#: Suffix's longest chain under the auto policy: the bench's Suffix rows drafted up to 8 (the policy
#: shortens each request's chain to what its acceptance pays for)
AUTO_MAX_DRAFT_LEN = 8
#: no drafts from this many running requests on: with 4 or 8 running, the auto policy's drafts cost more
#: than they won (0.83-0.93x none on Spec-Bench and HumanEval; 2-core AMD EPYC Zen 5, the shipped Q4_1 at
#: its codes, `bench/reports/2026-12-02-fast-defaults/`): its cost model prices a batch's draft rows
#: below what they take, which is issue 72's (batched decode)
AUTO_NO_DRAFTS_FROM_BATCH = 2


@dataclass(frozen=True, slots=True)
class AutoChoices:
    """Why the run's quantization and drafter are what they are (each line says auto or configured)."""

    quantization: str  #: "gguf: auto: a GGUF file runs at its own codes", "none: configured", ...
    speculation: str  #: "Suffix (up to 8 drafts, policy auto): auto: ...", "off: configured", ...

    def summary(self) -> str:
        return f"quantization {self.quantization}; drafter {self.speculation}"


def resolve_auto_defaults(
    model, config: ExecutorConfig, has_drafter: bool
) -> tuple[ExecutorConfig, AutoChoices]:
    """A copy of ``config`` with ``quantization`` and ``speculative_config`` resolved (never "auto"),
    and the reasons; ``config`` itself is left as it was, so it can serve another model."""
    quantization, quantization_reason = resolve_quantization(model, config)
    spec, speculation_reason = resolve_speculation(config, has_drafter)
    resolved = replace(config, quantization=quantization, speculative_config=spec)
    return resolved, AutoChoices(quantization_reason, speculation_reason)


def resolve_quantization(model, config: ExecutorConfig) -> tuple[str | None, str]:
    """The scheme ``config.quantization`` means for ``model`` (a path, None for the embedded model, or a
    module), and a line saying why."""
    requested = config.quantization
    if requested != "auto":
        return requested, f"{requested or 'none'}: configured"
    if isinstance(model, torch.nn.Module):
        return None, "none: auto: a module passed in keeps its own weights"
    source = model if model is not None else config.model
    if source is None:
        from .model.model_loader import default_model_path

        source = default_model_path()
    device = str(resolve_device(config.device))
    return auto_scheme(Path(source), config.dtype, device, config.device_map)


def resolve_speculation(config: ExecutorConfig, has_drafter: bool) -> tuple[SpeculativeConfig | None, str]:
    """The drafter ``config.speculative_config`` means, and a line saying why."""
    spec = config.speculative_config
    if spec is None:
        return None, "off: configured (speculative_config: none)"
    if isinstance(spec, SpeculativeConfig):
        return (
            spec,
            f"{spec.decoding_type} (up to {spec.max_draft_len} drafts, policy {spec.draft_len_policy}): configured",
        )
    if has_drafter:
        return None, "the drafter passed in (speculative_config auto: nothing to choose)"
    chosen = auto_speculative_config()
    return chosen, (
        f"{AUTO_DRAFTER} (up to {AUTO_MAX_DRAFT_LEN} drafts, policy auto, none from "
        f"{AUTO_NO_DRAFTS_FROM_BATCH} running requests): auto: the drafter the bench measures best without "
        "a trained head; drafts only where this machine's forward cost says they pay "
        "(speculative_config: none turns drafting off)"
    )


def auto_speculative_config(max_draft_len: int = AUTO_MAX_DRAFT_LEN) -> SpeculativeConfig:
    """What ``speculative_config: auto`` runs."""
    schedule = {1: max_draft_len, AUTO_NO_DRAFTS_FROM_BATCH: 0}
    return SpeculativeConfig(AUTO_DRAFTER, max_draft_len, schedule, draft_len_policy="auto")
