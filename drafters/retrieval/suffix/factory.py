"""Suffix decoding's factory, registered by `drafters/builtin.py`."""

from __future__ import annotations

from ...base import Drafter, DrafterContext, declare_options
from .options import SuffixOptions


@declare_options(SuffixOptions)
def make(options: SuffixOptions, context: DrafterContext) -> Drafter:
    from .drafter import SuffixDrafter

    return SuffixDrafter(context.max_draft_len, options)
