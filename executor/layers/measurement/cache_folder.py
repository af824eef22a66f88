"""Where specexec keeps what it builds and measures on this machine: converted GGUF models, the C++
kernels' builds, the measurements (`measurement_cache.py`)."""

from __future__ import annotations

import os
from pathlib import Path


def resolve_cache_dir(configured: str | os.PathLike | None = None) -> Path:
    """specexec's cache folder (converted GGUF models, this machine's measurements): ``configured``
    (`ExecutorConfig.cache_dir`) when given, else ``$SPECEXEC_CACHE_DIR``, else ``~/.cache/specexec``."""
    if configured is not None:
        return Path(configured).expanduser()
    return default_cache_dir()


def default_cache_dir() -> Path:
    env = os.environ.get("SPECEXEC_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specexec"
