"""LayerSkip's ``speculative_config`` keys, checked once when they are parsed."""

from __future__ import annotations

from dataclasses import dataclass

from ...executor.engine.options import check_number, reject_unknown_keys


@reject_unknown_keys
@dataclass(slots=True)
class LayerSkipOptions:
    option_label = "LayerSkip option"  #: (not a field) for the unknown-option error
    #: the target's layers the draft skips (0-based); None: chosen at start-up on calibration text
    skip_layers: list[int] | None = None
    calibration_tokens: int = 32  #: the target's own continuation of each calibration prompt, in tokens

    def __post_init__(self) -> None:
        check_number("calibration_tokens", self.calibration_tokens, 1, 512, integer=True)
        if self.skip_layers is not None and (
            not isinstance(self.skip_layers, list)
            or not self.skip_layers
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.skip_layers)
        ):
            raise ValueError(
                f"skip_layers must be a non-empty list of layer indices >= 0, got {self.skip_layers!r}"
            )
