"""Draft/target speculation: a second (smaller or quantized) model drafts (`drafter.py`); without one,
the target's own quantized copy, the self-draft (`self_draft.py`, `quantized_copy.py`)."""

from .drafter import DraftTargetDrafter, check_vocab_compatible
from .options import DraftTargetOptions

__all__ = ["DraftTargetDrafter", "DraftTargetOptions", "check_vocab_compatible"]
