"""Start the server: load the executor (warm-up on), build the app, run uvicorn until SIGTERM / Ctrl-C.

On SIGTERM uvicorn stops accepting connections and waits up to ``graceful_shutdown_s`` for the
requests in flight; the app's lifespan then closes the executor (running requests are aborted only if
they outlast that)."""

from __future__ import annotations

import logging
from pathlib import Path

from ..executor.async_executor import AsyncExecutor
from ..executor.config import ExecutorConfig
from ..executor.executor import Executor
from .app import ServerLimits, build_app

logger = logging.getLogger("specexec")


def served_model_name(config: ExecutorConfig) -> str:
    """The id clients pass as ``model``: the model's file or directory name (SmolLM2's for the default)."""
    if config.model is None:
        return "SmolLM2-135M-Instruct"
    return Path(str(config.model)).name.removesuffix(".gguf")


def serve(
    config: ExecutorConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    limits: ServerLimits | None = None,
    model_name: str | None = None,
    graceful_shutdown_s: float = 30.0,
) -> None:
    import uvicorn

    config.warmup = True
    engine = AsyncExecutor(Executor(config=config))
    name = model_name or served_model_name(config)
    app = build_app(engine, name, api_key=api_key, limits=limits)
    logger.warning("serving %s on http://%s:%d/v1", name, host, port)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=graceful_shutdown_s)
