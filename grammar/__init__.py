"""Grammar-guided decoding: response_format parsing, async compilation, per-request masks."""

from .compiler import GrammarCompilerPool
from .mask_worker import MaskJob, MaskResult, MaskWorker
from .request_grammar import RequestGrammar, RowFill
from .spec import KINDS, GrammarError, GrammarSpec

__all__ = [
    "KINDS",
    "GrammarCompilerPool",
    "GrammarError",
    "GrammarSpec",
    "MaskJob",
    "MaskResult",
    "MaskWorker",
    "RequestGrammar",
    "RowFill",
]
