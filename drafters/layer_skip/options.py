"""LayerSkip's ``speculative_config`` keys (checked before any model loads)."""

from __future__ import annotations

from dataclasses import dataclass

from ...executor.engine.options import reject_unknown_keys
from .drafter import LayerSkipConfig


@reject_unknown_keys
@dataclass(slots=True)
class LayerSkipOptions:
    """LayerSkip's own options; `LayerSkipConfig` documents each one."""

    option_label = "LayerSkip option"  #: (not a field) for the unknown-option error
    skip_layers: list[int] | None = None
    calibration_tokens: int = 32

    def __post_init__(self) -> None:
        LayerSkipConfig(
            skip_layers=self.skip_layers, calibration_tokens=self.calibration_tokens
        )  # checks values
