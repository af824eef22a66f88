"""Lookahead's ``speculative_config`` keys, checked once when they are parsed."""

from __future__ import annotations

from dataclasses import dataclass

from ...executor.engine.options import check_number, reject_unknown_keys


@reject_unknown_keys
@dataclass(slots=True)
class LookaheadOptions:
    option_label = "Lookahead option"  #: (not a field) for the unknown-option error
    window_size: int = 3  #: positions the Jacobi window guesses ahead
    ngram_size: int = 3  #: tokens of each pool n-gram, its first token the key (2..)
    pool_size: int = 8  #: n-grams kept per first token (the newest)
    verification_set_size: int = 2  #: the pool's n-grams drafted per step

    def __post_init__(self) -> None:
        check_number("window_size", self.window_size, 1, 32, integer=True)
        check_number("ngram_size", self.ngram_size, 2, 33, integer=True)
        check_number("pool_size", self.pool_size, 1, integer=True)
        check_number("verification_set_size", self.verification_set_size, 1, 16, integer=True)
