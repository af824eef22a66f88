"""NGram (prompt-lookup) drafting: what followed the current suffix earlier in the text (`drafter.py`),
with TensorRT-LLM's options (`options.py`)."""

from .drafter import NGramDrafter, NGramPool
from .options import NGramOptions

__all__ = ["NGramDrafter", "NGramOptions", "NGramPool"]
