"""OpenAI request bodies -> what the executor takes. Every field is either mapped or refused: a field the
server does not support is a 400 naming it, never silently ignored.

Defaults follow OpenAI's API, not `SamplingParams`: ``temperature`` 1, ``max_tokens`` the rest of the
context.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..executor.engine.request import Prompt, Request
from ..sampling import SamplingParams

#: fields both endpoints map onto SamplingParams (same name, same meaning); ignore_eos is vLLM's extension
_SAMPLING_FIELDS = frozenset(
    {
        "ignore_eos",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
    }
)
_COMMON_FIELDS = _SAMPLING_FIELDS | {
    "model",
    "max_tokens",
    "stop",
    "n",
    "stream",
    "stream_options",
    "response_format",
}
CHAT_FIELDS = _COMMON_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}
COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "logprobs"}
MAX_LOGPROBS = 20  #: top alternatives per token at most (OpenAI's limit)
MAX_N = 16  #: samples per request at most


class BadRequest(ValueError):
    """A request body the server refuses (HTTP 400); ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(slots=True)
class ParsedRequest:
    """One OpenAI request, as the executor will run it."""

    request: Request  #: prompt, sampling params (n, logprobs included) and response_format
    is_chat: bool
    stream: bool
    include_usage: bool  #: stream_options.include_usage: a last chunk with the usage
    num_top_logprobs: int | None  #: top alternatives per token in the response; None = no logprobs


def parse_chat(body: Any, max_model_len: int) -> ParsedRequest:
    body = _object(body)
    _refuse_unknown(body, CHAT_FIELDS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content} objects", "messages")
    prompt = [_message(m, i) for i, m in enumerate(messages)]
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    top = None
    if body.get("logprobs") is not None:
        if not isinstance(body["logprobs"], bool):
            raise BadRequest("logprobs must be true or false for chat completions", "logprobs")
        if body["logprobs"]:
            top = _int_in(body.get("top_logprobs", 0), "top_logprobs", 0, MAX_LOGPROBS)
    elif body.get("top_logprobs") is not None:
        raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
    return _parsed(body, prompt, max_tokens, max_model_len, top, is_chat=True)


def parse_completion(body: Any, max_model_len: int) -> ParsedRequest:
    body = _object(body)
    _refuse_unknown(body, COMPLETION_FIELDS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    is_text = isinstance(prompt, str) and prompt
    is_ids = (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    )
    if not (is_text or is_ids):
        raise BadRequest(
            "prompt must be non-empty text or a list of token ids (one prompt per request)", "prompt"
        )
    top = None
    if body.get("logprobs") is not None:
        top = _int_in(body["logprobs"], "logprobs", 0, MAX_LOGPROBS)
    return _parsed(body, prompt, body.get("max_tokens"), max_model_len, top, is_chat=False)


def _parsed(
    body: dict, prompt: Prompt, max_tokens, max_model_len: int, top: int | None, is_chat: bool
) -> ParsedRequest:
    options: dict[str, Any] = {"temperature": 1.0}
    options.update({k: body[k] for k in _SAMPLING_FIELDS if body.get(k) is not None})
    if options.get("top_k") == -1:  # vLLM's "off"
        options["top_k"] = 0
    options["max_tokens"] = max_model_len if max_tokens is None else max_tokens
    if body.get("stop") is not None:
        options["stop"] = body["stop"]
    n = _int_in(body.get("n", 1), "n", 1, MAX_N)
    if n != 1:
        options["n"] = n
    if top is not None:
        options["logprobs"] = top
    unknown = {k for k in options if k not in {f.name for f in fields(SamplingParams)}}
    if unknown:  # (a field this version's SamplingParams does not have yet)
        raise BadRequest(f"not supported by this server: {', '.join(sorted(unknown))}", sorted(unknown)[0])
    params = SamplingParams(**options)
    try:
        params.validate()
    except ValueError as exc:
        raise BadRequest(str(exc), _field_named(str(exc))) from exc
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false", "stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage"}:
        raise BadRequest("stream_options takes include_usage only", "stream_options")
    if stream_options and not stream:
        raise BadRequest("stream_options needs stream: true", "stream_options")
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "text":
        response_format = None
    request = Request(prompt, params, response_format=response_format)
    return ParsedRequest(request, is_chat, stream, bool(stream_options.get("include_usage")), top)


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _refuse_unknown(body: dict, allowed: frozenset[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"not supported by this server: {', '.join(unknown)}", unknown[0])


def _message(message: Any, i: int) -> dict:
    if not isinstance(message, dict) or "role" not in message:
        raise BadRequest(f"messages[{i}] must be an object with role and content", "messages")
    extra = set(message) - {"role", "content", "name"}
    if extra:
        raise BadRequest(
            f"messages[{i}]: not supported by this server: {', '.join(sorted(extra))}", "messages"
        )
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only
        if not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
            raise BadRequest(f"messages[{i}].content: only text parts are supported", "messages")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", "messages")
    return {"role": message["role"], "content": content}


def _int_in(value: Any, name: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"{name} must be an integer in {low}..{high}, got {value!r}", name)
    return value


def _field_named(message: str) -> str | None:
    """The field a SamplingParams error names (its messages start with the field's name)."""
    head = message.split(" ", 1)[0]
    return head if head.isidentifier() else None
