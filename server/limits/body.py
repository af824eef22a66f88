"""A request's JSON body, read within bounds: the body's size (413 past ``max_body_bytes``, checked on the
declared Content-Length and again while reading, which stops at the limit), its nesting (400 deeper than
`MAX_JSON_DEPTH`: Python's JSON parser recurses, so ``[`` x 100,000 raised RecursionError, a 500) and its
text (400 for a lone surrogate such as ``"\\ud800"``, which JSON's escapes allow and no tokenizer takes).
A large body is parsed and walked in a worker thread, so the event loop (``/health``, the streams) goes on
meanwhile."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Request

from ..bad_request import HTTPError

MAX_JSON_DEPTH = (
    64  #: objects and lists nested deeper than this are refused (a tool's schema nests ~2 a level)
)
OFF_LOOP_BYTES = 64 * 1024  #: a body larger than this is parsed in a worker thread
MIN_BODY_BYTES = 8 << 20  #: the default limit's floor: room for tools and JSON schemas beside the prompt
BODY_BYTES_PER_TOKEN = (
    256  #: the default limit per token of context (text escaped as ``\\uXXXX`` is 6 a char)
)


def default_max_body_bytes(max_model_len: int) -> int:
    """The body limit when none is set: `BODY_BYTES_PER_TOKEN` per token of context, at least
    `MIN_BODY_BYTES` (8 MiB; a 128k context gets 32 MiB)."""
    return max(MIN_BODY_BYTES, max_model_len * BODY_BYTES_PER_TOKEN)


async def read_json_body(request: Request, max_body_bytes: int) -> dict:
    """The request's JSON object, or an HTTPError: 413 past ``max_body_bytes``, 400 when it is not JSON,
    not an object, nested too deep or holds a lone surrogate."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_body_bytes:
        raise too_large(max_body_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:  # (stop reading: the rest is never buffered)
            raise too_large(max_body_bytes)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(parse_json_object, raw)
    return parse_json_object(raw)


def too_large(max_body_bytes: int) -> HTTPError:
    return HTTPError(
        413,
        f"the request body is larger than this server's limit of {max_body_bytes} bytes (--max-body-bytes)",
        "invalid_request_error",
        code="request_too_large",
        headers={"Connection": "close"},  # (the rest of the body is not read: the connection cannot go on)
    )


def parse_json_object(raw: bytes) -> dict:
    """``raw`` as a JSON object whose nesting and text are checked (`check_json`)."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HTTPError(400, f"the body is not JSON: {exc}", "invalid_request_error") from exc
    except RecursionError as exc:
        raise HTTPError(400, _too_deep_message(), "invalid_request_error") from exc
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object", "invalid_request_error")
    check_json(body)
    return body


def check_json(body: dict) -> None:
    """A 400 naming the field when ``body`` nests deeper than `MAX_JSON_DEPTH` or a string (a key too)
    holds a lone surrogate. Walked with a stack, not recursion: the walk itself must not overflow."""
    stack: list[tuple[Any, str, int]] = [(body, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise HTTPError(400, _too_deep_message(path), "invalid_request_error", _top_field(path))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str) and not _is_unicode(key):
                _refuse_surrogate(_join(path, key))
            if isinstance(item, str):
                if not _is_unicode(item):
                    _refuse_surrogate(_join(path, key))
            elif isinstance(item, (dict, list)):
                stack.append((item, _join(path, key), depth + 1))


def _is_unicode(text: str) -> bool:
    """False when ``text`` holds a lone surrogate (it cannot be encoded as UTF-8)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _join(path: str, key: Any) -> str:
    if isinstance(key, str) and not _is_unicode(key):  # (shown escaped: the error is JSON too)
        key = key.encode("utf-8", "backslashreplace").decode()
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))


def _top_field(path: str) -> str | None:
    return path.split(".")[0].split("[")[0] or None


def _too_deep_message(path: str = "") -> str:
    where = f" at {path}" if path else ""
    return f"the body nests objects or lists deeper than {MAX_JSON_DEPTH} levels{where}"


def _refuse_surrogate(path: str) -> None:
    raise HTTPError(
        400,
        f"{path} holds a lone surrogate (such as \\ud800): text must be valid Unicode",
        "invalid_request_error",
        _top_field(path),
    )
