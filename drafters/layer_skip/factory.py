"""LayerSkip's factory, registered by `drafters/builtin.py` (the layers are chosen when it is bound)."""

from __future__ import annotations

from ..base import Drafter, DrafterContext, declare_options
from .options import LayerSkipOptions


@declare_options(LayerSkipOptions)
def make(options: LayerSkipOptions, context: DrafterContext) -> Drafter:
    from .drafter import LayerSkipDrafter

    return LayerSkipDrafter(context.max_draft_len, options, context.tokenizer)
