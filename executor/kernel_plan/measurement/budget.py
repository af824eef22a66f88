"""When a start stops measuring: past its budget of seconds, or while other work takes the CPUs, a
choice with nothing stored for this machine takes its static default (`kernel_plan/static_defaults.py`)
instead of a measurement, and is measured at the next quiet start or by `specexec tune` (which has no
budget and measures whatever the CPUs do).

The budget bounds what a start spends measuring, not one measurement: a measurement begun under budget
runs to its end. Unbounded: ``None``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

from .journal import is_remeasuring
from .timing_noise import machine_is_busy

#: seconds a start may spend measuring (`ExecutorConfig.measuring_budget_s`'s default): SmolLM2's whole
#: plan measured in 3-11 s on the 2-core EPYC (GGUF codes and dense), a 0.5B model's in under 30 s
DEFAULT_BUDGET_S = 30.0
_deadline: ContextVar[float | None] = ContextVar("measuring_deadline", default=None)


@contextlib.contextmanager
def measuring_budget(seconds: float | None) -> Iterator[None]:
    """The measurements in the block stop (for choices with a static default) ``seconds`` after it
    begins; None: no bound."""
    token = _deadline.set(None if seconds is None else time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


def why_not_measure() -> str | None:
    """Why a choice with nothing stored should take its static default now, or None to measure it:
    ``specexec tune`` always measures; otherwise a spent budget, or CPUs other work takes."""
    if is_remeasuring():
        return None
    deadline = _deadline.get()
    if deadline is not None and time.monotonic() >= deadline:
        return "the start's measuring budget is spent"
    if machine_is_busy():
        return "other work takes the CPUs"
    return None
