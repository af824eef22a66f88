"""OpenAI's Responses API (`responses_api.py`): ``POST /v1/responses`` runs the request as a chat (its
conversation continued from a stored response with ``previous_response_id``) and answers whole or as the
API's event stream (`responses_stream.py`), storing it when asked; ``GET`` and ``DELETE
/v1/responses/{id}`` read and drop a stored one, its owner's only (`limits/access.py`)."""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ...executor.engine.request import RequestOutput
from .. import responses_api
from ..bad_request import BadRequest, HTTPError
from ..limits.admission import Reservation
from ..limits.text_bounds import check_prompt_size
from ..protocol import ParsedRequest, parse_chat
from ..request_events import next_or_none
from ..responses_stream import response_events
from .state import ServerState
from .submit import run, start


def add_response_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        return await respond(state, request)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> JSONResponse:
        found = state.stored.get(
            response_id, state.access.check_key(request)
        )  # (another owner's: never stored)
        if found is None:
            raise HTTPError(404, f"no stored response {response_id!r}", "not_found_error", "response_id")
        return JSONResponse(found.body)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request) -> JSONResponse:
        if not state.stored.delete(response_id, state.access.check_key(request)):
            raise HTTPError(404, f"no stored response {response_id!r}", "not_found_error", "response_id")
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})


async def respond(state: ServerState, request: Request) -> Response:
    """One ``POST /v1/responses``: the response object, or its event stream."""
    deadline = time.monotonic() + state.limits.request_timeout_s
    owner = state.access.check_key(request)
    body = await state.read_body(request)
    try:
        asked = responses_api.to_chat_body(body, state.stored, owner)
        parsed = parse_chat(asked.chat_body, state.max_model_len, state.reads_name)
        check_prompt_size(parsed.requests, state.max_prompt_chars, "input")
    except BadRequest as exc:
        raise HTTPError(400, str(exc), "invalid_request_error", exc.param) from exc
    state.check_model(body)
    (reservation,) = state.admission.admit(parsed.requests)
    if parsed.stream:
        return await _stream(state, request, deadline, reservation, asked, parsed, owner)
    (sample,) = await run(
        state, parsed.request, request, deadline, reservation
    )  # (an error or an abort: raised)
    items, continuation = responses_api.output_items(sample, parsed.tool_plan, responses_api.new_id("msg"))
    response_id = responses_api.new_id("resp")
    final = responses_api.response_object(
        response_id, asked, state.model_name, responses_api.now(), "completed", items, sample
    )
    _store(state, asked, owner, final, continuation)
    return JSONResponse(final)


async def _stream(
    state: ServerState,
    request: Request,
    deadline: float,
    reservation: Reservation,
    asked: responses_api.ResponsesRequest,
    parsed: ParsedRequest,
    owner: str,
) -> StreamingResponse:
    events, first = await start(state, parsed.request, request, deadline, reservation)

    def finished(sample: RequestOutput, items: list, continuation: list, final: dict) -> None:
        state.metrics.record(sample)  # (a stream's end: `run` records the others)
        _store(state, asked, owner, final, continuation)

    async def next_event():
        return await next_or_none(events, request, deadline)

    async def stream():
        try:
            async for chunk in response_events(
                first, next_event, parsed, asked, state.model_name, finished,
                lambda: time.monotonic() >= deadline,
            ):  # fmt: skip
                yield chunk
        finally:
            await events.aclose()

    return StreamingResponse(stream(), media_type="text/event-stream")


def _store(
    state: ServerState, asked: responses_api.ResponsesRequest, owner: str, final: dict, continuation: list
) -> None:
    """Keep a finished response (with ``store``), its conversation continued by ``continuation``."""
    if asked.store and final:
        conversation = asked.history + continuation
        state.stored.put(final["id"], responses_api.StoredResponse(conversation, final, owner))
