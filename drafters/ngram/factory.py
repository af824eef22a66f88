"""NGram's factory, registered by `drafters/builtin.py`."""

from __future__ import annotations

from ..base import Drafter, DrafterContext, declare_options
from .options import NGramOptions


@declare_options(NGramOptions)
def make(options: NGramOptions, context: DrafterContext) -> Drafter:
    from .drafter import NGramDrafter

    return NGramDrafter(context.max_draft_len, options)
