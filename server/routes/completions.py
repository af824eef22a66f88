"""``POST /v1/chat/completions`` and ``POST /v1/completions``: a body parsed and bounded, the model
checked, the sequences admitted, then every prompt's request run at once (in the same batches) and
answered whole, or the one request streamed (`completion_stream.py`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .. import responses
from ..bad_request import BadRequest, HTTPError
from ..limits.text_bounds import check_prompt_size, check_user
from ..protocol import ParsedRequest, parse_chat, parse_completion
from .completion_stream import completion_chunks
from .state import ServerState
from .submit import run, start


def add_completion_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await complete(state, request, parse_chat)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await complete(state, request, parse_completion)


async def complete(state: ServerState, request: Request, parse: Callable[..., ParsedRequest]) -> Response:
    """One completion request, its body read by ``parse`` (chat or text)."""
    deadline = time.monotonic() + state.limits.request_timeout_s  # one deadline for the whole request
    state.access.check_key(request)
    body = await state.read_body(request)
    try:
        parsed = parse(body, state.max_model_len, state.reads_name)
        check_user(parsed.user)
        check_prompt_size(parsed.requests, state.max_prompt_chars, "messages" if parsed.is_chat else "prompt")
    except BadRequest as exc:
        raise HTTPError(400, str(exc), "invalid_request_error", exc.param) from exc
    state.check_model(body)
    reservations = state.admission.admit(parsed.requests)
    ids = responses.ResponseIds(parsed.is_chat, state.model_name, state.tokenizer)
    if parsed.stream:
        events, first = await start(state, parsed.request, request, deadline, reservations[0])
        chunks = completion_chunks(state, events, first, parsed, ids, request, deadline)
        return StreamingResponse(chunks, media_type="text/event-stream")
    # every prompt's request runs at once (in the same batches); the first error is the answer
    results = await asyncio.gather(
        *(run(state, one, request, deadline, held) for one, held in zip(parsed.requests, reservations)),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return JSONResponse(responses.full_response(results, parsed, ids))
