"""Reading one request's token events on the HTTP side: the next event, or None once the client has
gone or the deadline has passed (the pending read cancelled, which aborts the request), and every
sample's output collected to the end."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from fastapi import Request

from ..executor.engine.request import RequestOutput, TokenEvent
from .bad_request import HTTPError

END = object()  #: the request's events are over (every sample finished)


async def next_or_none(events: AsyncIterator[TokenEvent], request: Request, deadline: float):
    """The next event; ``END`` after the last; None when the client disconnects or the deadline
    passes first (the pending read is cancelled, which aborts what is unfinished).

    If this coroutine is itself cancelled (the server cancels a stream whose client went away), the
    pending read is cancelled and awaited first: until it ends, the generator is still running, and
    the caller's ``aclose()`` would raise "asynchronous generator is already running"."""
    step = asyncio.ensure_future(anext(events, END))
    try:
        while True:
            done, _ = await asyncio.wait({step}, timeout=min(0.5, max(0.0, deadline - time.monotonic())))
            if done:
                return step.result()
            if time.monotonic() >= deadline or await request.is_disconnected():
                await cancel(step)  # the generator's own clean-up aborts the request
                return None
    except asyncio.CancelledError:
        await cancel(step)
        raise


async def cancel(step: asyncio.Future) -> None:
    """Cancel a pending read and wait until it has ended."""
    step.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await step


async def collect(
    events, first: TokenEvent, request: Request, deadline: float, timeout_s: float
) -> list[RequestOutput]:
    """Every sample's output, in sample order, unless ``deadline`` (the request's arrival + ``timeout_s``)
    passes first."""
    outputs: dict[int, RequestOutput] = {}
    event = first
    while event is not END:
        if event.finished and event.output is not None:
            outputs[event.sample_index] = event.output
        try:
            event = await next_or_none(events, request, deadline)
        except asyncio.CancelledError:  # (the server stops at once): the request is aborted, now
            await events.aclose()
            raise
        if event is None:
            await events.aclose()  # aborts what is unfinished
            if await request.is_disconnected():
                raise HTTPError(499, "client disconnected", "client_closed_request")
            raise HTTPError(504, f"the request ran past {timeout_s} s and was aborted", "timeout_error")
    return [outputs[i] for i in sorted(outputs)]
