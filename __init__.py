"""specexec: a speculative-decoding executor for Hugging Face decoder-only models.

Heavy imports (torch, transformers) happen on first use of an attribute, so `specexec --help` is fast.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING


def _leave_the_checkout_off_sys_path() -> None:
    """Run from a checkout (`python -m pytest`, `python -m specexec` in the repo), Python puts the checkout's
    root first on sys.path. That root is this package, so its folders would import as top-level modules
    too, and `kernels/` (specexec.kernels) shadows the `kernels` distribution transformers imports (an
    ImportError from transformers). specexec itself comes through its install, never through that entry."""
    root = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != root]
    shadow = sys.modules.get("kernels")
    if shadow is not None and os.path.dirname(os.path.dirname(getattr(shadow, "__file__", "") or "")) == root:
        del sys.modules["kernels"]


_leave_the_checkout_off_sys_path()

from .plugins import hookimpl  # noqa: E402

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
