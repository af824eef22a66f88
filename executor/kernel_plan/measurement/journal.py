"""What this process's start measured and what it read from the store, for the tables of
`specexec tune` and `specexec run -v`; and the switch `specexec tune` measures everything under."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

_remeasuring: ContextVar[bool] = ContextVar("remeasuring", default=False)
_journal: list[MeasurementNote] = []


@dataclass(frozen=True, slots=True)
class MeasurementNote:
    kind: str  #: "forward-cost", "attention-paths", ...
    how: str  #: measured, measured while busy, stored, stored (measured while busy)
    seconds: float  #: what measuring took (0 for one read from the store)
    path: Path | None  #: its file in the store (None: no store)


def note_measurement(kind: str, how: str, seconds: float, path: Path | None) -> None:
    _journal.append(MeasurementNote(kind, how, seconds, path))


def measurement_notes(since: int = 0) -> list[MeasurementNote]:
    """The notes from the ``since``-th on (`len(measurement_notes())` before a start: that start's)."""
    return _journal[since:]


def is_remeasuring() -> bool:
    return _remeasuring.get()


@contextlib.contextmanager
def remeasuring() -> Iterator[None]:
    """Every measurement in the block is taken again and stored, whatever the store holds."""
    token = _remeasuring.set(True)
    try:
        yield
    finally:
        _remeasuring.reset(token)
