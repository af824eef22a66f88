"""The OpenAI-compatible HTTP front (FastAPI): ``/v1/chat/completions``, ``/v1/completions`` (SSE
streaming and not), ``/v1/responses`` (`responses_api.py`), ``/v1/models``, ``/health``, ``/metrics``,
and the worker endpoints routers call (`worker_endpoints.py`).

What a client sees when something goes wrong: a bad body or a request the executor refuses -> 400 with
an OpenAI error object whose ``param`` names the field; a body past the size limit -> 413; an internal
fault -> 500; the queue full (counted in sequences) -> 503 with ``Retry-After``; past the request timeout
-> 504 (streaming: an error event, then the stream ends). A client that disconnects aborts its request at
once; an aborted stream simply ends. The bounds and who may call what: `limits/`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..executor.async_executor import AsyncExecutor, ExecutorClosedError
from ..executor.engine.request import FinishReason, RequestOutput
from . import responses, responses_api
from .bad_request import HTTPError
from .limits.access import Access
from .limits.admission import Admission, Reservation
from .limits.body import default_max_body_bytes, read_json_body
from .limits.text_bounds import check_prompt_size, check_user, max_chars_per_token
from .metrics import ServerMetrics
from .protocol import BadRequest, ParsedRequest, parse_chat, parse_completion, template_reads_name
from .request_events import END, collect, next_or_none
from .responses_stream import response_events
from .tool_stream import ToolCallStream
from .worker_endpoints import add_worker_endpoints


@dataclass(slots=True)
class ServerLimits:
    #: waiting + running sequences (a request's prompts x n) beyond which new requests get 503
    max_queued_requests: int = 256
    request_timeout_s: float = 600.0  #: a request running longer is aborted (504)
    retry_after_s: int = 1  #: the Retry-After of a 503
    #: a larger request body is refused (413) unread; None: from the context (`default_max_body_bytes`)
    max_body_bytes: int | None = None
    #: the Responses store's budget (the JSON of its conversations and bodies); the oldest go first
    max_stored_response_bytes: int = responses_api.MAX_STORED_BYTES


def build_app(
    engine: AsyncExecutor,
    model_name: str,
    api_key: str | list[str] | None = None,
    limits=None,
    allow_remote_admin: bool = False,
) -> FastAPI:
    """The app around a running `AsyncExecutor`; closing the app's lifespan closes the engine.
    ``api_key``: one key or several (any opens the API; each owns what it stores); without keys the
    admin endpoints answer loopback clients only, unless ``allow_remote_admin`` (`limits/access.py`)."""
    limits = limits or ServerLimits()
    metrics = ServerMetrics(engine.executor, model_name)
    max_model_len = engine.executor.max_model_len
    tokenizer = engine.executor.tokenizer
    reads_name = template_reads_name(tokenizer)
    created = int(time.time())
    access = Access(api_key, allow_remote_admin)
    admission = Admission(engine, limits.max_queued_requests, limits.retry_after_s)
    max_body_bytes = limits.max_body_bytes or default_max_body_bytes(max_model_len)
    max_prompt_chars = max_model_len * max_chars_per_token(tokenizer)

    async def lifespan(app: FastAPI):
        yield
        await engine.close(timeout_s=limits.request_timeout_s)

    app = FastAPI(title="specexec", lifespan=lifespan)
    app.state.engine, app.state.metrics = engine, metrics

    @app.exception_handler(HTTPError)
    async def http_error(request: Request, exc: HTTPError) -> JSONResponse:
        return JSONResponse(
            responses.error_body(str(exc), exc.kind, exc.param, exc.code), exc.status, headers=exc.headers
        )

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse(responses.error_body(str(exc), "invalid_request_error", exc.param), 400)

    async def read_body(request: Request) -> dict:
        """The request's JSON object, within the body's bounds (`limits/body.py`)."""
        return await read_json_body(request, max_body_bytes)

    check_key = access.check_key

    @app.get("/health")
    async def health() -> Response:
        if engine.is_closing:  # draining (SIGTERM) or closed: a router sends new requests elsewhere
            return JSONResponse(
                {"status": "draining"}, 503, headers={"Retry-After": str(limits.retry_after_s)}
            )
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        check_key(request)
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "specexec"}
        return JSONResponse({"object": "list", "data": [{**card, "max_model_len": max_model_len}]})

    async def complete(request: Request, parse: Callable[..., ParsedRequest]) -> Response:
        deadline = time.monotonic() + limits.request_timeout_s  # one deadline for the whole request
        check_key(request)
        body = await read_body(request)
        try:
            parsed = parse(body, max_model_len, reads_name)
            check_user(parsed.user)
            check_prompt_size(parsed.requests, max_prompt_chars, "messages" if parsed.is_chat else "prompt")
        except BadRequest as exc:
            raise HTTPError(400, str(exc), "invalid_request_error", exc.param) from exc
        check_model(body)
        reservations = admission.admit(parsed.requests)
        ids = responses.ResponseIds(parsed.is_chat, model_name, tokenizer)
        if parsed.stream:
            events, first = await start(parsed.request, request, deadline, reservations[0])
            chunks = _stream(events, first, parsed, ids, metrics, request, deadline, limits.request_timeout_s)
            return StreamingResponse(chunks, media_type="text/event-stream")
        # every prompt's request runs at once (in the same batches); the first error is the answer
        results = await asyncio.gather(
            *(run(one, request, deadline, held) for one, held in zip(parsed.requests, reservations)),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return JSONResponse(responses.full_response(results, parsed, ids))

    def check_model(body: dict) -> None:
        if body.get("model") not in (None, model_name):
            raise HTTPError(
                404,
                f"model {body['model']!r} is not served here; this server serves {model_name!r}",
                "not_found_error",
                "model",
                code="model_not_found",
            )

    async def start(one, request: Request, deadline: float, reservation: Reservation):
        """Submit one request (its reservation handed over to the engine's count once it is queued);
        (its events, its first event). A request refused at once or one that gets no token in time is
        an HTTPError."""
        try:
            events = engine.generate(one, on_submitted=reservation.release)
            first = await next_or_none(events, request, deadline)
        except ExecutorClosedError as exc:
            raise HTTPError(
                503, str(exc), "server_error", headers={"Retry-After": str(limits.retry_after_s)}
            ) from exc
        finally:
            reservation.release()  # (also when the generator never ran)
        if first is None:  # the client went away, or it ran past the timeout before its first token
            await events.aclose()
            raise HTTPError(504, f"no token within {limits.request_timeout_s} s", "timeout_error")
        if first.finished and first.output is not None and first.output.finish_reason is FinishReason.ERROR:
            metrics.record(first.output)
            await events.aclose()
            raise _error_of(first.output)
        return events, first

    async def run(one, request: Request, deadline: float, reservation: Reservation) -> list[RequestOutput]:
        """One prompt's request to its end: every sample's output, in sample order."""
        events, first = await start(one, request, deadline, reservation)
        outputs = await collect(events, first, request, deadline, limits.request_timeout_s)
        for output in outputs:
            metrics.record(output)
        for output in outputs:
            if output.finish_reason is FinishReason.ERROR:
                raise _error_of(output)
            if output.finish_reason is FinishReason.ABORT:
                raise HTTPError(503, "the request was aborted (the server is shutting down)", "server_error")
        return outputs

    add_worker_endpoints(app, engine, model_name, check_key, read_body, access.check_admin)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await complete(request, parse_chat)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await complete(request, parse_completion)

    stored = responses_api.ResponseStore(max_bytes=limits.max_stored_response_bytes)

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        deadline = time.monotonic() + limits.request_timeout_s
        owner = check_key(request)
        body = await read_body(request)
        try:
            asked = responses_api.to_chat_body(body, stored, owner)
            parsed = parse_chat(asked.chat_body, max_model_len, reads_name)
            check_prompt_size(parsed.requests, max_prompt_chars, "input")
        except BadRequest as exc:
            raise HTTPError(400, str(exc), "invalid_request_error", exc.param) from exc
        check_model(body)
        (reservation,) = admission.admit(parsed.requests)

        def store(final: dict, continuation: list) -> None:
            if asked.store and final:
                conversation = asked.history + continuation
                stored.put(final["id"], responses_api.StoredResponse(conversation, final, owner))

        def finished(sample: RequestOutput, items: list, continuation: list, final: dict) -> None:
            metrics.record(sample)  # (a stream's end: `run` records the others)
            store(final, continuation)

        if parsed.stream:
            events, first = await start(parsed.request, request, deadline, reservation)

            async def next_event():
                return await next_or_none(events, request, deadline)

            async def stream():
                try:
                    async for chunk in response_events(
                        first, next_event, parsed, asked, model_name, finished,
                        lambda: time.monotonic() >= deadline,
                    ):  # fmt: skip
                        yield chunk
                finally:
                    await events.aclose()

            return StreamingResponse(stream(), media_type="text/event-stream")
        (sample,) = await run(
            parsed.request, request, deadline, reservation
        )  # (an error or an abort: raised)
        items, continuation = responses_api.output_items(
            sample, parsed.tool_plan, responses_api.new_id("msg")
        )
        response_id = responses_api.new_id("resp")
        final = responses_api.response_object(
            response_id, asked, model_name, responses_api.now(), "completed", items, sample
        )
        store(final, continuation)
        return JSONResponse(final)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> JSONResponse:
        found = stored.get(response_id, check_key(request))  # (another owner's: as if never stored)
        if found is None:
            raise HTTPError(404, f"no stored response {response_id!r}", "not_found_error", "response_id")
        return JSONResponse(found.body)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request) -> JSONResponse:
        if not stored.delete(response_id, check_key(request)):
            raise HTTPError(404, f"no stored response {response_id!r}", "not_found_error", "response_id")
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    return app


async def _stream(
    events,
    first,
    parsed: ParsedRequest,
    ids,
    metrics: ServerMetrics,
    request: Request,
    deadline: float,
    timeout_s: float,
):
    """Server-sent events: one chunk per token event (``index`` = the sample); the usage chunk when
    asked; ``[DONE]`` once every sample finished, or an error event when ``deadline`` passes first."""
    event = first
    finished: list[RequestOutput] = []
    num_prompt = num_output = 0  # for stream_options.continuous_usage_stats
    tool_streams: dict[int, ToolCallStream] = {}  # per sample, with tools
    try:
        if parsed.is_chat:
            yield responses.sse(responses.first_chunk(parsed, ids))
        elif parsed.echo:  # the prompt first, as the full response has it before the completion
            yield responses.sse(responses.echo_chunk(parsed, ids))
        while event is not END:
            if event is None:
                if time.monotonic() >= deadline:
                    yield responses.sse(
                        responses.error_body(f"the request ran past {timeout_s} s", "timeout_error")
                    )
                return
            output = event.output if event.finished else None
            if output is not None:
                metrics.record(output)
                if output.finish_reason is FinishReason.ABORT:
                    return  # an aborted request's stream simply ends
                if output.finish_reason is FinishReason.ERROR:
                    yield responses.sse(responses.error_body(output.error or "error", _kind_of(output)[0]))
                    return
                finished.append(output)
            if parsed.tool_plan is not None and parsed.tool_plan.reads_calls:  # calls as generated
                calls = tool_streams.setdefault(event.sample_index, ToolCallStream(parsed.tool_plan))
                deltas = calls.feed(event.text) + (calls.finish() if output is not None else [])
                for delta in deltas:
                    yield responses.sse(responses.delta_chunk(event.sample_index, delta, ids))
                if output is not None:
                    finish = str(output.finish_reason)
                    if calls.made_calls and output.finish_reason is FinishReason.STOP:
                        finish = "tool_calls"
                    yield responses.sse(responses.delta_chunk(event.sample_index, {}, ids, finish))
                event = await next_or_none(events, request, deadline)
                continue
            so_far = None
            if parsed.continuous_usage:
                num_output += len(event.token_ids)
                num_prompt = event.num_prompt_tokens
                so_far = {"prompt_tokens": num_prompt, "completion_tokens": num_output}
                so_far["total_tokens"] = num_prompt + num_output
            yield responses.sse(responses.chunk(event, parsed, ids, so_far))
            event = await next_or_none(events, request, deadline)
        if parsed.include_usage:
            yield responses.sse(responses.usage_chunk(finished, ids))
        yield b"data: [DONE]\n\n"
    finally:
        await events.aclose()  # (a no-op once finished; otherwise it aborts the request)


def _kind_of(output: RequestOutput) -> tuple[str, int]:
    return ("invalid_request_error", 400) if output.is_invalid_request else ("server_error", 500)


def _error_of(output: RequestOutput) -> HTTPError:
    kind, status = _kind_of(output)
    return HTTPError(status, output.error or "error", kind)
