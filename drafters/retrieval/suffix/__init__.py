"""Suffix decoding: drafts from each request's own text and earlier outputs (`drafter.py`), with vLLM's
options (`options.py`)."""

from .drafter import SuffixDrafter
from .options import SuffixOptions

__all__ = ["SuffixDrafter", "SuffixOptions"]
