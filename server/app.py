"""The OpenAI-compatible HTTP front (FastAPI): ``/v1/chat/completions``, ``/v1/completions`` (SSE
streaming and not), ``/v1/responses`` (`responses_api.py`), ``/v1/models``, ``/health``, ``/metrics``,
and the worker endpoints routers call; each group of routes is a module of `routes/`.

What a client sees when something goes wrong: a bad body or a request the executor refuses -> 400 with
an OpenAI error object whose ``param`` names the field; a body past the size limit -> 413; an internal
fault -> 500; the queue full (counted in sequences) -> 503 with ``Retry-After``; past the request timeout
-> 504 (streaming: an error event, then the stream ends). A client that disconnects aborts its request at
once; an aborted stream simply ends. The bounds and who may call what: `limits/`; the error bodies:
`routes/errors.py`.
"""

from __future__ import annotations

from fastapi import FastAPI

from ..executor.async_executor import AsyncExecutor
from .limits.access import Access
from .limits.server_limits import ServerLimits
from .routes.completions import add_completion_routes
from .routes.errors import add_error_handlers
from .routes.openai_responses import add_response_routes
from .routes.service import add_service_routes
from .routes.state import ServerState
from .routes.workers import add_worker_routes

__all__ = ["ServerLimits", "build_app"]


def build_app(
    engine: AsyncExecutor,
    model_name: str,
    api_key: str | list[str] | None = None,
    limits: ServerLimits | None = None,
    allow_remote_admin: bool = False,
) -> FastAPI:
    """The app around a running `AsyncExecutor`; closing the app's lifespan closes the engine.
    ``api_key``: one key or several (any opens the API; each owns what it stores); without keys the
    admin endpoints answer loopback clients only, unless ``allow_remote_admin`` (`limits/access.py`)."""
    limits = limits or ServerLimits()
    state = ServerState.create(engine, model_name, limits, Access(api_key, allow_remote_admin))

    async def lifespan(app: FastAPI):
        yield
        await engine.close(timeout_s=limits.request_timeout_s)

    app = FastAPI(title="specexec", lifespan=lifespan)
    app.state.engine, app.state.metrics = engine, state.metrics
    add_error_handlers(app)
    add_service_routes(app, state)
    add_worker_routes(app, state)
    add_completion_routes(app, state)
    add_response_routes(app, state)
    return app
