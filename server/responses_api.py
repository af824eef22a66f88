"""OpenAI's Responses API (``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``) over the chat
path: a request is translated into a chat completion's body (`to_chat_body`), run as one, and its
sample answered as a response object (`response_object`) or as the Responses stream's events
(`ResponseStream`).

What maps onto what:

- ``input`` (text, or a list of items: messages with ``input_text`` / ``output_text`` parts, ``function_call``
  and ``function_call_output`` items) and ``instructions`` (a system message first) -> ``messages``;
- ``tools`` (flat ``{"type": "function", "name", "description", "parameters"}``) and ``tool_choice``
  -> the chat ones; a call comes back as a ``function_call`` output item;
- ``text.format`` (``json_schema`` / ``json_object``) -> ``response_format`` (guided decoding); a key of
  ``text`` or of its format this server does not read is a 400;
- ``max_output_tokens``, ``temperature``, ``top_p``, ``parallel_tool_calls``, ``metadata``, ``user``,
  ``cache_salt``, and vLLM's ``seed``, ``stop``, ``top_k``, ``repetition_penalty``, ``ignore_eos`` and
  ``structured_outputs`` as chat takes them;
- ``previous_response_id``: the stored conversation of an earlier response (its input, instructions
  excepted as OpenAI's are, and its output) goes before this input. Responses are stored unless
  ``store: false``, in memory, for the server's lifetime, the oldest dropped past a count and a byte
  budget (the JSON of what each holds); each belongs to the API key that made it (`limits/access.py`):
  another key's GET, DELETE or ``previous_response_id`` of it is answered as for an id never stored.

Not supported, refused with a 400 naming the field: built-in tools (web search, file search, ...),
``background``, ``conversation``, ``prompt`` templates, reasoning settings and images or files in the input.
A field no engine here knows is logged once and ignored, as on the chat path.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..executor.engine.request import FinishReason, RequestOutput
from .bad_request import BadRequest
from .limits.text_bounds import check_user
from .requests.field_table import RESPONSES
from .requests.fields import check_fields, check_object
from .tools import read_calls

#: responses kept for ``previous_response_id`` at most (the oldest are dropped first)
MAX_STORED_RESPONSES = 1000
#: the store's budget in bytes of JSON (conversations and bodies); the oldest are dropped past it
MAX_STORED_BYTES = 256 << 20
#: Responses fields answered as the chat field of the same meaning (what each does, and what is refused
#: or ignored on this endpoint: `requests/field_table.py`)
_PASSED = (
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "metadata",
    "user",
    "stream",
    "cache_salt",
    # vLLM's Responses extensions, sampled as chat samples them
    "seed",
    "stop",
    "top_k",
    "repetition_penalty",
    "ignore_eos",
    "structured_outputs",
)
#: what ``text.format`` of each type may hold
_FORMAT_KEYS = {
    "text": {"type"},
    "json_object": {"type"},
    "json_schema": {"type", "name", "schema", "strict", "description"},
}


@dataclass(slots=True)
class StoredResponse:
    """What a later ``previous_response_id`` continues: the conversation up to and with this output."""

    messages: list[dict]  #: chat messages, instructions excluded
    body: dict  #: the response object, as answered
    owner: str = ""  #: the identity of the API key that made it ("" on a server without keys)
    num_bytes: int = 0  #: its JSON's size, counted against the store's budget (set by `ResponseStore.put`)


@dataclass
class ResponseStore:
    """Stored responses, newest last, at most ``limit`` of them and ``max_bytes`` of their JSON (the
    oldest dropped first; one larger than the whole budget is not kept)."""

    limit: int = MAX_STORED_RESPONSES
    max_bytes: int = MAX_STORED_BYTES
    num_bytes: int = 0  #: what the stored responses take now
    _items: OrderedDict = field(default_factory=OrderedDict)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self.delete(response_id, stored.owner)
        stored.num_bytes = _json_size(stored.messages) + _json_size(stored.body)
        if stored.num_bytes > self.max_bytes:
            return
        self._items[response_id] = stored
        self.num_bytes += stored.num_bytes
        while len(self._items) > self.limit or self.num_bytes > self.max_bytes:
            _, dropped = self._items.popitem(last=False)
            self.num_bytes -= dropped.num_bytes

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The stored response when ``owner`` made it; None otherwise, as for an id never stored."""
        found = self._items.get(response_id)
        return found if found is not None and found.owner == owner else None

    def delete(self, response_id: str, owner: str) -> bool:
        if self.get(response_id, owner) is None:
            return False
        self.num_bytes -= self._items.pop(response_id).num_bytes
        return True


def _json_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False))


@dataclass(slots=True)
class ResponsesRequest:
    """One Responses request, translated."""

    chat_body: dict  #: the chat completion body that runs it
    history: list[dict]  #: the chat messages before the model's answer (instructions excluded)
    body: dict  #: the request as sent
    store: bool


def to_chat_body(body: Any, store: ResponseStore, owner: str = "") -> ResponsesRequest:
    """A Responses body -> the chat body that runs it (BadRequest naming the field when it cannot);
    ``owner`` (the caller's key identity) may continue only its own stored responses."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    check_user(body.get("user"))
    check_fields(body, RESPONSES)  # (refused fields raise; the rest are read below by name)
    history: list[dict] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        stored = store.get(previous, owner) if isinstance(previous, str) else None
        if stored is None:
            raise BadRequest(f"previous_response_id {previous!r} is not stored here", "previous_response_id")
        history = list(stored.messages)
    history += _input_messages(body.get("input"))
    messages = list(history)
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("instructions must be text", "instructions")
        messages.insert(0, {"role": "system", "content": instructions})
    chat: dict = {"messages": messages}
    chat.update({k: body[k] for k in _PASSED if body.get(k) is not None})
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        chat["tools"] = [_chat_tool(t, i) for i, t in enumerate(_list(body["tools"], "tools"))]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _chat_tool_choice(body["tool_choice"])
    if body.get("text") is not None:
        format_ = _response_format(body["text"])
        if format_ is not None:
            chat["response_format"] = format_
    keep = body.get("store", True)
    if not isinstance(keep, bool):
        raise BadRequest("store must be true or false", "store")
    return ResponsesRequest(chat, history, body, keep)


def _list(value: Any, name: str) -> list:
    if not isinstance(value, list):
        raise BadRequest(f"{name} must be a list", name)
    return value


def _input_messages(value: Any) -> list[dict]:
    """``input`` -> chat messages: text is one user message; items are messages or tool items."""
    if isinstance(value, str):
        if not value:
            raise BadRequest("input must be non-empty text or a list of items", "input")
        return [{"role": "user", "content": value}]
    items = _list(value, "input")
    if not items:
        raise BadRequest("input must be non-empty text or a list of items", "input")
    messages: list[dict] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}] must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise BadRequest(f"input[{i}].role must be user, system, developer or assistant", "input")
            messages.append({"role": role, "content": _text_of(item.get("content"), i)})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id") or item.get("id") or f"call_{i}"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
            }
            if not isinstance(call["function"]["name"], str):
                raise BadRequest(f"input[{i}]: a function_call needs its name", "input")
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # (parallel calls: one assistant turn)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = json.dumps(output)
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id")), "content": output})
        else:
            raise BadRequest(f"input[{i}]: items of type {kind!r} are not supported by this server", "input")
    return messages


def _text_of(content: Any, i: int) -> str:
    """A message's content: text, or its text parts (``input_text`` / ``output_text`` / ``text``) joined."""
    if isinstance(content, str):
        return content
    parts = []
    for part in _list(content, "input"):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise BadRequest(f"input[{i}]: only text content is supported (got {kind!r})", "input")
        parts.append(part["text"])
    return "".join(parts)


def _chat_tool(tool: Any, i: int) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise BadRequest(f"tools[{i}]: only function tools are supported (got {kind!r})", "tools")
    function = {
        k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None
    }
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text: Any) -> dict | None:
    """``text`` -> chat's response_format: ``text.format`` (a key it does not read is a 400 naming text;
    its json_schema's keys are then checked as chat's)."""
    format_ = check_object("text", text, RESPONSES).get("format")
    if format_ is None:
        return None
    if not isinstance(format_, dict) or format_.get("type") not in _FORMAT_KEYS:
        raise BadRequest("text.format must be an object of type text, json_object or json_schema", "text")
    kind = format_["type"]
    unread = sorted(set(format_) - _FORMAT_KEYS[kind])
    if unread:
        raise BadRequest(f"text.format.{unread[0]} does not go with type {kind}", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    schema = {k: v for k, v in format_.items() if k != "type" and v is not None}
    return {"type": "json_schema", "json_schema": schema}


# ---- answering ------------------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(sample: RequestOutput, plan, message_id: str) -> tuple[list[dict], list[dict]]:
    """The response's output items for a chat sample (a message, and a function call per call it
    made), and the chat message that continues the conversation from it."""
    text, calls = (sample.text, []) if plan is None or not plan.reads_calls else read_calls(plan, sample.text)
    items: list[dict] = []
    if text or not calls:
        items.append(message_item(message_id, text or "", "completed"))
    chat_calls = []
    for call in calls:
        call_id = new_id("call")
        arguments = json.dumps(call["arguments"], ensure_ascii=False)
        items.append(function_call_item(new_id("fc"), call_id, call["name"], arguments, "completed"))
        function = {"name": call["name"], "arguments": arguments}
        chat_calls.append({"id": call_id, "type": "function", "function": function})
    message: dict = {"role": "assistant", "content": text or ""}
    if chat_calls:
        message["tool_calls"] = chat_calls
    return items, [message]


def message_item(item_id: str, text: str, status: str) -> dict:
    content = (
        []
        if status == "in_progress"
        else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    )
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def response_object(
    response_id: str,
    request: ResponsesRequest,
    model: str,
    created: int,
    status: str,
    output: list[dict],
    sample: RequestOutput | None,
) -> dict:
    """The response object (``status`` in_progress while a stream runs; then completed or incomplete)."""
    body = request.body
    incomplete = None
    if sample is not None and sample.finish_reason is FinishReason.LENGTH:
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    usage = None
    if sample is not None:
        m = sample.metrics
        usage = {
            "input_tokens": m.num_prompt_tokens,
            "input_tokens_details": {"cached_tokens": m.num_cached_tokens},
            "output_tokens": m.num_output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": m.num_prompt_tokens + m.num_output_tokens,
        }
    text_format = (body.get("text") or {}).get("format") or {"type": "text"}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": None,
        "store": request.store,
        "temperature": body.get("temperature", 1.0),
        "text": {"format": text_format},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": usage,
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


def event(kind: str, sequence_number: int, **fields: Any) -> bytes:
    """One event of a Responses stream, in its SSE framing (``event:`` then ``data:``)."""
    payload = {"type": kind, "sequence_number": sequence_number, **fields}
    return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def now() -> int:
    return int(time.time())
