"""Drafters: the `Drafter` base class and the built-in drafters (registered in `builtin`)."""

from .base import Drafter, DrafterContext, DraftProposal

__all__ = ["DraftProposal", "Drafter", "DrafterContext"]
