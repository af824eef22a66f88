"""Suffix decoding's ``speculative_config`` keys (vLLM's ``suffix_decoding_*`` names without the prefix)."""

from __future__ import annotations

from dataclasses import dataclass

from ....executor.engine.options import check_number, reject_unknown_keys
from ..lookup_options import LookupOptions


@reject_unknown_keys
@dataclass(slots=True)
class SuffixOptions(LookupOptions):
    option_label = "Suffix option"  #: (not a field) for the unknown-option error
    #: finished requests whose outputs stay in the shared index (0: each request drafts from itself only)
    max_cached_requests: int = 1000

    def __post_init__(self) -> None:
        LookupOptions.__post_init__(self)
        check_number("max_cached_requests", self.max_cached_requests, 0, None, integer=True)
