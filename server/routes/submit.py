"""One prompt's request on the executor, for the routes that generate: `start` submits it and waits for
its first event, `run` also collects every sample's output. What goes wrong is an `HTTPError`: the
server closed (503), no token in time (504), the request refused or failed (`errors.error_of`),
aborted by a shutdown (503)."""

from __future__ import annotations

from fastapi import Request

from ...executor.async_executor import ExecutorClosedError
from ...executor.engine.request import FinishReason, RequestOutput
from ...executor.engine.request import Request as EngineRequest
from ..bad_request import HTTPError
from ..limits.admission import Reservation
from ..request_events import collect, next_or_none
from .errors import error_of
from .state import ServerState


async def start(
    state: ServerState, one: EngineRequest, request: Request, deadline: float, reservation: Reservation
):
    """Submit one request (its reservation handed over to the engine's count once it is queued);
    (its events, its first event). A request refused at once or one that gets no token in time is
    an HTTPError."""
    timeout_s = state.limits.request_timeout_s
    try:
        events = state.engine.generate(one, on_submitted=reservation.release)
        first = await next_or_none(events, request, deadline)
    except ExecutorClosedError as exc:
        raise HTTPError(
            503, str(exc), "server_error", headers={"Retry-After": str(state.limits.retry_after_s)}
        ) from exc
    finally:
        reservation.release()  # (also when the generator never ran)
    if first is None:  # the client went away, or it ran past the timeout before its first token
        await events.aclose()
        raise HTTPError(504, f"no token within {timeout_s} s", "timeout_error")
    if first.finished and first.output is not None and first.output.finish_reason is FinishReason.ERROR:
        state.metrics.record(first.output)
        await events.aclose()
        raise error_of(first.output)
    return events, first


async def run(
    state: ServerState, one: EngineRequest, request: Request, deadline: float, reservation: Reservation
) -> list[RequestOutput]:
    """One prompt's request to its end: every sample's output, in sample order."""
    events, first = await start(state, one, request, deadline, reservation)
    outputs = await collect(events, first, request, deadline, state.limits.request_timeout_s)
    for output in outputs:
        state.metrics.record(output)
    for output in outputs:
        if output.finish_reason is FinishReason.ERROR:
            raise error_of(output)
        if output.finish_reason is FinishReason.ABORT:
            raise HTTPError(503, "the request was aborted (the server is shutting down)", "server_error")
    return outputs
