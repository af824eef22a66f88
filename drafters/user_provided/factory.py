"""UserProvided's factory, registered by `drafters/builtin.py`."""

from __future__ import annotations

from ..base import Drafter, DrafterContext, declare_options
from .options import UserProvidedOptions


@declare_options(UserProvidedOptions)
def make(options: UserProvidedOptions, context: DrafterContext) -> Drafter:
    """``drafter: "package.module:ClassName"`` with ``drafter_options: {...}`` for its constructor."""
    return options.drafter_class(max_draft_len=context.max_draft_len, **options.drafter_options)
