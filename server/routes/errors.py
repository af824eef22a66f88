"""How an error reaches a client: OpenAI's error object, with the status an `HTTPError` carries (a
`BadRequest` from the body's checks is a 400 naming its field), and a request the executor failed as
the error it answers with (refused input 400, an internal fault 500)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ...executor.engine.request import RequestOutput
from .. import responses
from ..bad_request import BadRequest, HTTPError


def add_error_handlers(app: FastAPI) -> None:
    """Answer the HTTP errors the routes raise with OpenAI's error body."""

    @app.exception_handler(HTTPError)
    async def http_error(request: Request, exc: HTTPError) -> JSONResponse:
        return JSONResponse(
            responses.error_body(str(exc), exc.kind, exc.param, exc.code), exc.status, headers=exc.headers
        )

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse(responses.error_body(str(exc), "invalid_request_error", exc.param), 400)


def error_kind(output: RequestOutput) -> tuple[str, int]:
    """A failed request's OpenAI error type and HTTP status."""
    return ("invalid_request_error", 400) if output.is_invalid_request else ("server_error", 500)


def error_of(output: RequestOutput) -> HTTPError:
    """The HTTP error a failed request answers with."""
    kind, status = error_kind(output)
    return HTTPError(status, output.error or "error", kind)
