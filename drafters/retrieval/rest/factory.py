"""REST's factory, registered by `drafters/builtin.py`: the datastore is indexed here, once."""

from __future__ import annotations

from ...base import Drafter, DrafterContext, declare_options
from .options import RestOptions


@declare_options(RestOptions)
def make(options: RestOptions, context: DrafterContext) -> Drafter:
    from .drafter import RestDrafter

    return RestDrafter(context.max_draft_len, options, context.tokenizer, context.vocab_size)
