"""The Responses API's stream (``stream: true`` on ``/v1/responses``): OpenAI's event sequence for one
sample, each event numbered (``sequence_number``) in SSE framing.

``response.created`` and ``response.in_progress``; for the message, ``response.output_item.added``,
``response.content_part.added``, a ``response.output_text.delta`` per token event as it is generated,
``response.output_text.done``, ``response.content_part.done`` and ``response.output_item.done``; for
each function call (a request with tools: read once its sample ends), ``response.output_item.added``,
``response.function_call_arguments.delta`` and ``.done``, ``response.output_item.done``; then
``response.completed`` (or ``response.incomplete`` when ``max_output_tokens`` cut it, or
``response.failed`` with the error).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from ..executor.engine.request import FinishReason, RequestOutput
from . import responses_api as api


async def response_events(
    first,
    next_event: Callable[[], Awaitable],
    parsed,
    request: api.ResponsesRequest,
    model: str,
    on_finished: Callable[[RequestOutput, list[dict], list[dict], dict], None],
    timed_out: Callable[[], bool],
) -> AsyncIterator[bytes]:
    """The events of one sample whose first token event is ``first``; ``next_event()`` gives the next
    (None: the client left or the deadline passed; the end marker is any non-event). ``on_finished``
    gets the finished sample, its output items, the chat messages that continue from it and the final
    response object (to record and store)."""
    response_id, created, seq = api.new_id("resp"), api.now(), 0
    message_id = api.new_id("msg")
    reads_calls = parsed.tool_plan is not None and parsed.tool_plan.reads_calls

    def emit(kind: str, **fields) -> bytes:
        nonlocal seq
        seq += 1
        return api.event(kind, seq - 1, **fields)

    def snapshot(status: str, output: list[dict], sample=None) -> dict:
        return api.response_object(response_id, request, model, created, status, output, sample)

    yield emit("response.created", response=snapshot("in_progress", []))
    yield emit("response.in_progress", response=snapshot("in_progress", []))
    where = {"item_id": message_id, "output_index": 0, "content_index": 0}
    if not reads_calls:  # the text streams as it is generated
        yield emit(
            "response.output_item.added", output_index=0, item=api.message_item(message_id, "", "in_progress")
        )
        yield emit("response.content_part.added", **where, part=_text_part(""))
    event, text, sample = first, [], None
    while True:
        if event is None:
            message = "the request ran past its timeout" if timed_out() else "the client went away"
            error = {"code": "timeout" if timed_out() else "aborted", "message": message}
            yield emit("response.failed", response={**snapshot("failed", []), "error": error})
            return
        if not hasattr(event, "finished"):
            break
        if event.text and not reads_calls:
            text.append(event.text)
            yield emit("response.output_text.delta", **where, delta=event.text, logprobs=[])
        if event.finished and event.output is not None:
            sample = event.output
            if sample.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
                error = {"code": "server_error", "message": sample.error or str(sample.finish_reason)}
                yield emit("response.failed", response={**snapshot("failed", []), "error": error})
                on_finished(sample, [], [], {})
                return
        event = await next_event()
    items, continuation = api.output_items(sample, parsed.tool_plan, message_id)
    if not reads_calls:
        whole = "".join(text)
        yield emit("response.output_text.done", **where, text=whole, logprobs=[])
        yield emit("response.content_part.done", **where, part=_text_part(whole))
        yield emit("response.output_item.done", output_index=0, item=items[0])
    else:
        for index, item in enumerate(items):
            for one in _whole_item(emit, index, item):
                yield one
    final = snapshot("completed", items, sample)
    on_finished(sample, items, continuation, final)
    kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield emit(kind, response=final)


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _whole_item(emit, index: int, item: dict):
    """An output item known whole (a request with tools): its added / delta / done events."""
    if item["type"] == "message":
        text = item["content"][0]["text"]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        yield emit(
            "response.output_item.added",
            output_index=index,
            item=api.message_item(item["id"], "", "in_progress"),
        )
        yield emit("response.content_part.added", **where, part=_text_part(""))
        yield emit("response.output_text.delta", **where, delta=text, logprobs=[])
        yield emit("response.output_text.done", **where, text=text, logprobs=[])
        yield emit("response.content_part.done", **where, part=_text_part(text))
    else:
        added = {**item, "arguments": "", "status": "in_progress"}
        where = {"item_id": item["id"], "output_index": index}
        yield emit("response.output_item.added", output_index=index, item=added)
        yield emit("response.function_call_arguments.delta", **where, delta=item["arguments"])
        yield emit("response.function_call_arguments.done", **where, arguments=item["arguments"])
    yield emit("response.output_item.done", output_index=index, item=item)
