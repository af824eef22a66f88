"""Option dataclasses that refuse what they do not know: an unknown key is a `ValueError` naming it and
the keys allowed, never Python's `TypeError` about an unexpected keyword argument; `check_number` refuses
a value out of range, naming the option."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

T = TypeVar("T")


def reject_unknown_keys(cls: type[T]) -> type[T]:
    """Class decorator for a dataclass: ``cls(unknown=1)`` raises ValueError naming ``unknown``."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    init = cls.__init__  # type: ignore[misc]
    label = getattr(cls, "option_label", f"{cls.__name__} key")

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            plural = "s" if len(unknown) > 1 else ""
            raise ValueError(
                f"unknown {label}{plural} {', '.join(map(repr, unknown))}; allowed: {', '.join(names)}"
            )
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    return cls


def parse_options(cls: type[T], data: Any) -> T:
    """Build an option dataclass from a mapping (YAML, a dict), with the decorator's clear errors."""
    if not isinstance(data, dict):
        raise ValueError(f"{getattr(cls, 'option_label', cls.__name__)}s must be a mapping, got {data!r}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ValueError(f"option names must be strings, got {bad!r}")
    return cls(**data)


def check_number(name: str, value, low: float, high: float | None = None, integer: bool = False) -> None:
    """Refuse an option that is not a number in ``low``..``high`` (an integer where ``integer``)."""
    kinds = (int,) if integer else (int, float)
    ok = (
        isinstance(value, kinds)
        and not isinstance(value, bool)
        and value == value  # NaN
        and low <= value
        and (high is None or value <= high)
    )
    if not ok:
        kind = "an integer" if integer else "a number"
        allowed = f"{kind} in {low}..{high}" if high is not None else f"{kind} >= {low}"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
