"""Lookahead's factory, registered by `drafters/builtin.py`."""

from __future__ import annotations

from ..base import Drafter, DrafterContext, declare_options
from .options import LookaheadOptions


@declare_options(LookaheadOptions)
def make(options: LookaheadOptions, context: DrafterContext) -> Drafter:
    from .drafter import LookaheadDrafter

    return LookaheadDrafter(context.max_draft_len, options)
