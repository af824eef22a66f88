"""The lookup options Suffix and REST share (`SpeculationLimits`, by the names users set)."""

from __future__ import annotations

from dataclasses import dataclass

from ...executor.engine.options import check_number
from .suffix_index import DEFAULT_LIMITS, SpeculationLimits


@dataclass(slots=True)
class LookupOptions:
    max_tree_depth: int = DEFAULT_LIMITS.max_depth  #: longest context suffix matched
    max_spec_factor: float = DEFAULT_LIMITS.max_spec_factor  #: drafts per matched token
    max_spec_offset: float = DEFAULT_LIMITS.max_spec_offset  #: drafts added to that (may be negative)
    #: a chain stops once its estimated acceptance falls below this
    min_token_prob: float = DEFAULT_LIMITS.min_token_prob
    #: a key's most recent places read per lookup (bounds a step's work)
    max_occurrences: int = DEFAULT_LIMITS.max_occurrences

    def __post_init__(self) -> None:
        check_number("max_tree_depth", self.max_tree_depth, 1, 1024, integer=True)
        check_number("max_spec_factor", self.max_spec_factor, 0.0, 1024.0)
        check_number("max_spec_offset", self.max_spec_offset, -1024.0, 1024.0)
        check_number("min_token_prob", self.min_token_prob, 0.0, 1.0)
        check_number("max_occurrences", self.max_occurrences, 1, None, integer=True)

    def limits(self) -> SpeculationLimits:
        return SpeculationLimits(
            self.max_tree_depth,
            self.max_spec_factor,
            self.max_spec_offset,
            self.min_token_prob,
            self.max_occurrences,
        )
