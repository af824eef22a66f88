"""UserProvided's ``speculative_config`` keys: the drafter class by import path, and its constructor's
keyword arguments, both checked (class imported, arguments bound) when they are parsed."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field

from ...executor.engine.options import reject_unknown_keys
from ..base import Drafter


@reject_unknown_keys
@dataclass(slots=True)
class UserProvidedOptions:
    option_label = "UserProvided option"  #: (not a field) for the unknown-option error
    drafter: str | None = None  #: "package.module:ClassName", a specexec Drafter subclass
    drafter_options: dict = field(default_factory=dict)  #: keyword arguments of its constructor
    drafter_class: type[Drafter] | None = field(default=None, init=False)  #: the class ``drafter`` names

    def __post_init__(self) -> None:
        self.drafter_class = _imported_drafter_class(self.drafter, self.drafter_options)


def _imported_drafter_class(target, drafter_options) -> type[Drafter]:
    """The class named by ``target`` (imported, checked; its constructor takes ``drafter_options``)."""
    if not isinstance(target, str) or ":" not in target:
        raise ValueError(f"UserProvided needs option drafter: 'package.module:ClassName', got {target!r}")
    module_name, _, class_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import drafter {target!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Drafter)):
        raise ValueError(f"{target!r} is not a subclass of specexec.drafters.Drafter")
    if not isinstance(drafter_options, dict):
        raise ValueError(f"drafter_options must be a mapping, got {drafter_options!r}")
    try:
        inspect.signature(cls).bind_partial(**drafter_options)
    except TypeError as exc:
        raise ValueError(f"drafter_options do not fit {target}'s constructor: {exc}") from exc
    return cls
