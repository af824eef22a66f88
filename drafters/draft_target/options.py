"""DraftTarget's ``speculative_config`` keys, checked once when they are parsed."""

from __future__ import annotations

from dataclasses import dataclass

from ...executor.engine.options import reject_unknown_keys
from ...executor.layers.quantized.quantization import check_quantization
from ..model_options import DraftModelOptions


@reject_unknown_keys
@dataclass(slots=True)
class DraftTargetOptions(DraftModelOptions):
    """``speculative_model`` None = a quantized copy of the target (the self-draft)."""

    option_label = "DraftTarget option"  #: (not a field) for the unknown-option error
    #: the draft model's weight-only quantization (as the executor's: auto, none, int8, int4, gguf); auto
    #: = int8 for the self-draft, for a draft model the executor's rule (a GGUF at its own codes)
    quantization: str | None = "auto"

    def __post_init__(self) -> None:
        DraftModelOptions.__post_init__(self)
        check_quantization(self.quantization)
        if self.model_path is None and self.quantization == "none":  # (the draft would be the target)
            raise ValueError("DraftTarget option quantization: a self-draft takes auto, int8, int4, gguf")
