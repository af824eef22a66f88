"""Start the server: load the executor (warm-up on), build the app, run uvicorn until SIGTERM / Ctrl-C.

While the model loads, the port already answers: every path with 503 ``{"status": "loading"}`` and a
``Retry-After``, and a router's gRPC probe with HTTP/2's "use HTTP/1.1" (`listener.py`); a port
in use fails at once, not after the load.

On SIGTERM (or Ctrl-C) the server drains: no new request is admitted (``/health`` and new completions
answer 503, so a router sends them elsewhere), uvicorn stops accepting connections and waits up to
``graceful_shutdown_s`` for the requests in flight; the app's lifespan then closes the executor
(running requests are aborted only if they outlast that), and the process exits with status 0."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from ..executor.async_executor import AsyncExecutor
from ..executor.config import ExecutorConfig
from ..executor.executor import Executor
from .app import ServerLimits, build_app
from .listener import Http1Protocol, answering_loading, listening_socket

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
    api_key: str | list[str] | None = None,
    limits: ServerLimits | None = None,
    model_name: str | None = None,
    graceful_shutdown_s: float = 30.0,
    allow_remote_admin: bool = False,
) -> None:
    """Serve until SIGTERM or Ctrl-C (a second one stops at once). The executor steps in this (the main)
    thread, where torch's CPU kernels run fastest; uvicorn's event loop runs in a thread beside it.
    ``api_key``: one key or several; ``allow_remote_admin``: the admin endpoints answer any client when
    no key is set (else loopback ones only)."""
    import uvicorn

    config.warmup = True
    sock = listening_socket(host, port)  # (one socket: the loading answer's, then the real server's)
    try:
        with answering_loading(host, port, sock):
            engine = AsyncExecutor(Executor(config=config), start_thread=False)
    except BaseException:
        sock.close()  # (a model that did not load: the port goes at once)
        raise
    name = model_name or served_model_name(config)
    app = build_app(engine, name, api_key=api_key, limits=limits, allow_remote_admin=allow_remote_admin)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            timeout_graceful_shutdown=graceful_shutdown_s,
            http=Http1Protocol,  # (a router's gRPC probe told to use HTTP/1.1, not logged as invalid)
        )
    )

    def run_server() -> None:
        try:
            server.run(sockets=[sock])  # (its lifespan's end closes the engine, which ends run_loop below)
        finally:
            engine.stop_loop()  # also when it never started (the port is taken)

    def on_signal(signum, frame) -> None:
        engine.drain()
        if server.should_exit:
            server.force_exit = True
        server.should_exit = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    thread = threading.Thread(target=run_server, name="specexec-http")
    thread.start()
    logger.warning("serving %s on http://%s:%d/v1", name, host, port)
    try:
        engine.run_loop()
        thread.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise ValueError(f"the server could not start on {host}:{port} (is the port in use?)")
