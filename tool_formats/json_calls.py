"""Calls as bare JSON: one call is the object ``{"name": <function>, "arguments": {...}}``, several a
list of them. It is the format a guided tool choice (``required``, a named function) is held to by a
grammar, and the payload of a Hermes block (`hermes.py`). This module writes it (a call's text, the
schema that holds an output to calls) and reads it (a whole output, or calls as they are written).
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

KEYS = frozenset({"name", "arguments"})  #: a call object's keys, no more
#: the head of one call object, up to where its arguments' value begins (the schema writes name first)
CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z0-9_-]+)"\s*,\s*"arguments"\s*:\s*')
SCALAR = re.compile(r"[^,}\]\s]+")  #: a number, true, false or null


# ---- writing -------------------------------------------------------------------------------------------
def call_text(name: Any, arguments: Any) -> str:
    """One call object's JSON (``arguments`` an object; `arguments_object` decodes a string first)."""
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def arguments_object(arguments: Any) -> Any:
    """A call's ``arguments`` as an object when given as a JSON string (else as given: the history is
    the caller's)."""
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            return json.loads(arguments)
    return arguments


def calls_schema(parameters: dict[str, dict], as_list: bool) -> dict:
    """The JSON schema of a call to one of the functions (name -> its parameters' schema), or with
    ``as_list`` of a non-empty list of such calls."""
    calls = [_call_schema(name, schema) for name, schema in parameters.items()]
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {"type": "array", "minItems": 1, "items": one} if as_list else one


def _call_schema(name: str, parameters: dict) -> dict:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


# ---- reading a whole output ------------------------------------------------------------------------------
def read_values(text: str) -> list[Any] | None:
    """The values an output holds where calls are expected: its JSON, a list's items or the one value;
    None when it is not JSON (cut short by ``max_tokens``). Which are calls the caller judges
    (`is_call`, then the function's parameters)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, list) else [value]


def is_call(value: Any) -> bool:
    """Whether a value has a call object's shape: a dict with exactly ``name`` and ``arguments``."""
    return isinstance(value, dict) and set(value) == KEYS


# ---- reading as it is written ------------------------------------------------------------------------
def calls_so_far(text: str, max_calls: int) -> list[tuple[str, str]]:
    """(name, arguments' JSON text so far) of each call object whose name is written in ``text``, a
    growing output of calls (at most ``max_calls``); the last one's arguments may still be open."""
    calls, at = [], 0
    for _ in range(max_calls):
        head = CALL_HEAD.search(text, at)
        if head is None:
            break
        end = value_end(text, head.end())
        calls.append((head.group(1), text[head.end() : end if end is not None else len(text)]))
        if end is None:
            break
        at = end
    return calls


def value_end(text: str, start: int) -> int | None:
    """One past the end of the JSON value starting at ``text[start]`` (whitespace before it skipped),
    or None while it is still open."""
    i, n = start, len(text)
    while i < n and text[i] in " \t\r\n":
        i += 1
    if i == n:
        return None
    if text[i] == '"':
        return _string_end(text, i)
    if text[i] not in "{[":
        match = SCALAR.match(text, i)
        end = match.end() if match else i
        return end if end < n else None
    depth = 0
    while i < n:
        c = text[i]
        if c == '"':
            close = _string_end(text, i)
            if close is None:
                return None
            i = close
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _string_end(text: str, i: int) -> int | None:
    """One past the closing quote of the string opening at ``text[i]``, or None while open."""
    i += 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i + 1
        i += 1
    return None
