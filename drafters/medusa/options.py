"""Medusa's ``speculative_config`` keys, checked once when they are parsed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...executor.engine.options import reject_unknown_keys


@reject_unknown_keys
@dataclass(slots=True)
class MedusaOptions:
    """``speculative_model`` is a Medusa heads directory (`specexec train-medusa`; None: the heads
    shipped for the embedded SmolLM2)."""

    option_label = "Medusa option"  #: (not a field) for the unknown-option error
    speculative_model: str | None = None  #: the heads directory
    speculative_model_dir: str | None = None  #: trtllm-bench's name for the same

    def __post_init__(self) -> None:
        for key in ("speculative_model", "speculative_model_dir"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not Path(value).expanduser().is_dir()):
                raise ValueError(f"{key}: {value!r} does not exist (a Medusa heads directory)")
