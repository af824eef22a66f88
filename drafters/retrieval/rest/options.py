"""REST's ``speculative_config`` keys: the datastore, and the lookup's limits as Suffix names them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ....executor.engine.options import reject_unknown_keys
from ..lookup_options import LookupOptions

REST_SPEC_FACTOR = 1.0
REST_SPEC_OFFSET = 0.0


@reject_unknown_keys
@dataclass(slots=True)
class RestOptions(LookupOptions):
    option_label = "REST option"  #: (not a field) for the unknown-option error
    datastore: str = ""  #: the ``.npz`` file `specexec build-datastore` wrote for this target's tokenizer
    #: drafts per matched token, and drafts added to that (may be negative): 1 and 0, not Suffix's 2 and 1.
    #: A large corpus matches short suffixes anywhere; on HumanEval over Python's standard library the
    #: longer drafts doubled the drafts for the same accepted tokens
    #: (`bench/reports/2026-11-29-suffix-decoding/`)
    max_spec_factor: float = REST_SPEC_FACTOR
    max_spec_offset: float = REST_SPEC_OFFSET

    def __post_init__(self) -> None:
        if not isinstance(self.datastore, str) or not self.datastore:
            raise ValueError(
                f"REST needs option datastore: the .npz file `specexec build-datastore` wrote, got {self.datastore!r}"
            )
        LookupOptions.__post_init__(self)
        if not Path(self.datastore).expanduser().is_file():
            raise ValueError(
                f"datastore: {self.datastore!r} is not a file (build one with `specexec build-datastore`)"
            )
