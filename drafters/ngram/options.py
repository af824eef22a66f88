"""NGram's ``speculative_config`` keys (TensorRT-LLM's names), checked once when they are parsed."""

from __future__ import annotations

from dataclasses import dataclass

from ...executor.engine.options import check_number, reject_unknown_keys


@reject_unknown_keys
@dataclass(slots=True)
class NGramOptions:
    option_label = "NGram option"  #: (not a field) for the unknown-option error
    #: longest suffix used as the lookup key (>= 1); keys of size max..1 are tried, longest first
    max_matching_ngram_size: int = 3
    is_public_pool: bool = True  #: one pool shared by all requests, or one per request
    #: keep every distinct continuation seen for a key (else only the newest/oldest one)
    is_keep_all: bool = True
    is_use_oldest: bool = True  #: propose the oldest stored continuation (else the newest)
    #: memory bound on each pool: least recently used keys are evicted beyond this (TensorRT-LLM's grows forever)
    max_pool_entries: int = 1_000_000

    def __post_init__(self) -> None:
        check_number("max_matching_ngram_size", self.max_matching_ngram_size, 1, integer=True)
        check_number("max_pool_entries", self.max_pool_entries, 1, integer=True)
        for name in ("is_public_pool", "is_keep_all", "is_use_oldest"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
