"""What the service is and how it is doing: ``GET /health`` (503 while it drains, so a router sends new
requests elsewhere), ``GET /metrics`` (Prometheus, `metrics.py`) and ``GET /v1/models`` (the one model
served, with its context)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from .state import ServerState


def add_service_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health() -> Response:
        if state.engine.is_closing:  # draining (SIGTERM) or closed: a router sends new requests elsewhere
            return JSONResponse(
                {"status": "draining"}, 503, headers={"Retry-After": str(state.limits.retry_after_s)}
            )
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        state.access.check_key(request)
        card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "specexec"}
        return JSONResponse({"object": "list", "data": [{**card, "max_model_len": state.max_model_len}]})
