"""specexec: a speculative-decoding executor for Hugging Face decoder-only models.

Heavy imports (torch, transformers) happen on first use of an attribute, so `specexec --help` is fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .plugins import hookimpl

__version__ = "0.1.0"

_LAZY = {
    "AsyncExecutor": "specexec.executor.async_executor",
    "Executor": "specexec.executor.executor",
    "ExecutorConfig": "specexec.executor.config",
    "Request": "specexec.executor.engine.request",
    "RequestOutput": "specexec.executor.engine.request",
    "TokenEvent": "specexec.executor.engine.request",
    "FinishReason": "specexec.executor.engine.request",
    "SamplingParams": "specexec.sampling.params",
}

__all__ = [
    "AsyncExecutor",
    "Executor",
    "ExecutorConfig",
    "FinishReason",
    "Request",
    "RequestOutput",
    "SamplingParams",
    "TokenEvent",
    "__version__",
    "hookimpl",
]

if TYPE_CHECKING:
    from .executor.async_executor import AsyncExecutor
    from .executor.config import ExecutorConfig
    from .executor.engine.request import FinishReason, Request, RequestOutput, TokenEvent
    from .executor.executor import Executor
    from .sampling.params import SamplingParams


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specexec' has no attribute {name!r}")
