"""A streamed ``/v1/chat/completions`` or ``/v1/completions`` answer as server-sent events: one chunk per
token event (``index`` = the sample; with tools, content and call deltas as they are generated,
`tool_stream.py`), the usage chunk when asked, ``[DONE]`` once every sample finished, or an error event
when the request fails or its deadline passes first. An aborted request's stream simply ends."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from ...executor.engine.request import FinishReason, RequestOutput, TokenEvent
from .. import responses
from ..protocol import ParsedRequest
from ..request_events import END, next_or_none
from ..tool_stream import ToolCallStream
from .errors import error_kind
from .state import ServerState


async def completion_chunks(
    state: ServerState,
    events: AsyncIterator[TokenEvent],
    first: TokenEvent,
    parsed: ParsedRequest,
    ids: responses.ResponseIds,
    request: Request,
    deadline: float,
) -> AsyncIterator[bytes]:
    """The stream's chunks, from the request's first event on; closing it aborts what is unfinished."""
    event: Any = first  # a TokenEvent, END, or None (the client left or the deadline passed)
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
                    timeout_s = state.limits.request_timeout_s
                    yield responses.sse(
                        responses.error_body(f"the request ran past {timeout_s} s", "timeout_error")
                    )
                return
            output = event.output if event.finished else None
            if output is not None:
                state.metrics.record(output)
                if output.finish_reason is FinishReason.ABORT:
                    return  # an aborted request's stream simply ends
                if output.finish_reason is FinishReason.ERROR:
                    yield responses.sse(responses.error_body(output.error or "error", error_kind(output)[0]))
                    return
                finished.append(output)
            if parsed.tool_plan is not None and parsed.tool_plan.reads_calls:  # calls as generated
                calls = tool_streams.setdefault(event.sample_index, ToolCallStream(parsed.tool_plan))
                for chunk in _tool_chunks(calls, event, output, ids):
                    yield chunk
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


def _tool_chunks(
    calls: ToolCallStream, event: TokenEvent, output: RequestOutput | None, ids: responses.ResponseIds
) -> list[bytes]:
    """A sample with tools: the content and call deltas its new text gives, and once it finished what
    was held back and its finish reason (``tool_calls`` when it made calls and stopped by itself)."""
    deltas = calls.feed(event.text) + (calls.finish() if output is not None else [])
    chunks = [responses.sse(responses.delta_chunk(event.sample_index, delta, ids)) for delta in deltas]
    if output is not None:
        finish = str(output.finish_reason)
        if calls.made_calls and output.finish_reason is FinishReason.STOP:
            finish = "tool_calls"
        chunks.append(responses.sse(responses.delta_chunk(event.sample_index, {}, ids, finish)))
    return chunks
