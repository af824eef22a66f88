"""Lookahead's ``speculative_config`` keys (checked before any model loads)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...executor.engine.options import reject_unknown_keys
from .drafter import LookaheadConfig


@reject_unknown_keys
@dataclass(slots=True)
class LookaheadOptions:
    """Lookahead's own options; `LookaheadConfig` documents each one."""

    option_label = "Lookahead option"  #: (not a field) for the unknown-option error
    window_size: int = 3
    ngram_size: int = 3
    pool_size: int = 8
    verification_set_size: int = 2

    def __post_init__(self) -> None:
        LookaheadConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})  # checks values
