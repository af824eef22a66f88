"""The request fields that ask for an output format, whoever's names they use, -> the one
`Request.response_format` the engine's guided decoding takes (`grammar/spec.py`): OpenAI's
``response_format``, vLLM's ``structured_outputs`` and ``guided_json`` / ``guided_regex`` /
``guided_choice`` / ``guided_grammar``, SGLang's ``json_schema`` / ``regex`` / ``ebnf``, llama.cpp's
``grammar`` (GBNF, which xgrammar's EBNF reads) and ``json_schema``. A request names at most one;
each value is checked here and a bad one is a 400 naming its field (a regex or grammar that does not
compile is refused by the engine, also as a 400).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..bad_request import BadRequest
from .fields import check_object

#: response_format's type -> the keys that go with it (its rows in `field_table.py`)
_FORMAT_KEYS = {
    "text": (),
    "json_object": ("schema",),
    "json_schema": ("json_schema", "schema"),
    "regex": ("regex",),
    "grammar": ("grammar",),
    "choice": ("choice",),
    "structural_tag": ("format", "structures", "triggers", "at_least_one"),
}


def guided_format(body: dict, endpoint: str) -> dict | None:
    """The engine's ``response_format`` for what ``body`` asks; None when it asks for free text."""
    asked = {}
    for name, read in _READERS.items():
        if body.get(name) is not None:
            format_ = read(body[name], name, endpoint)
            if format_ is not None:
                asked[name] = format_
    if len(asked) > 1:
        first, second = sorted(asked, key=lambda n: n != "response_format")[:2]
        raise BadRequest(f"{second} and {first} both set an output format: send one", second)
    return next(iter(asked.values()), None)


def _response_format(value: Any, name: str, endpoint: str) -> dict | None:
    keys = check_object(name, value, endpoint)
    kind = keys.pop("type", None)
    if kind not in _FORMAT_KEYS:
        raise BadRequest(f"response_format.type must be one of {', '.join(_FORMAT_KEYS)}", name)
    wrong = sorted(set(value) - {"type", *_FORMAT_KEYS[kind]})
    if wrong:
        raise BadRequest(f"response_format.{wrong[0]} does not go with type {kind}", name)
    if kind == "text":
        return None
    if kind in ("json_object", "json_schema"):
        schema = keys.get("schema")
        if kind == "json_schema" and value.get("json_schema") is not None:
            if schema is not None:
                raise BadRequest(
                    "response_format: send the schema in json_schema or beside it, not both", name
                )
            inner = check_object(f"{name}.json_schema", value["json_schema"], endpoint)
            schema = inner.get("schema")
            if not isinstance(schema, dict):
                raise BadRequest("response_format.json_schema needs a schema object", name)
        if schema is None:
            if kind == "json_schema":
                raise BadRequest("response_format type json_schema needs a schema", name)
            return {"type": "json_object"}
        return _schema_format(schema, name)
    if kind == "structural_tag":
        return {"type": kind, **keys}
    return {"type": kind, kind: keys.get(kind)}


def _structured_outputs(value: Any, name: str, endpoint: str) -> dict | None:
    """vLLM's ``structured_outputs``: one of json, regex, choice, grammar, json_object, structural_tag."""
    keys = {k: v for k, v in check_object(name, value, endpoint).items() if v is not None and v is not False}
    if len(keys) > 1:
        raise BadRequest(f"structured_outputs sets {' and '.join(sorted(keys))}: send one", name)
    if not keys:
        return None
    ((key, inner),) = keys.items()
    if key == "json":
        return _schema_format(inner, name)
    if key == "json_object":
        return {"type": "json_object"}
    if key == "structural_tag":
        tag = _json_value(inner, name, "a structural tag (an object, or its JSON text)")
        if not isinstance(tag, dict):
            raise BadRequest("structured_outputs.structural_tag must be a structural tag object", name)
        return {**tag, "type": "structural_tag"}
    return _READERS[{"regex": "guided_regex", "choice": "guided_choice", "grammar": "guided_grammar"}[key]](
        inner, name, endpoint
    )


def _schema(value: Any, name: str, endpoint: str) -> dict:
    return _schema_format(value, name)


def _schema_format(value: Any, name: str) -> dict:
    schema = _json_value(value, name, "a JSON schema (an object, or its JSON text)")
    if not isinstance(schema, dict):
        raise BadRequest(f"{name} must be a JSON schema (an object, or its JSON text)", name)
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def _json_value(value: Any, name: str, what: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise BadRequest(f"{name} must be {what}", name) from None


def _regex(value: Any, name: str, endpoint: str) -> dict:
    return {"type": "regex", "regex": _text(value, name, "a regex")}


def _grammar(value: Any, name: str, endpoint: str) -> dict:
    return {"type": "grammar", "grammar": _text(value, name, "an EBNF / GBNF grammar")}


def _choice(value: Any, name: str, endpoint: str) -> dict:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise BadRequest(f"{name} must be a non-empty list of strings", name)
    return {"type": "choice", "choice": value}


def _text(value: Any, name: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{name} must be {what} (non-empty text)", name)
    return value


#: field -> how its value becomes a response_format (None: free text)
_READERS: dict[str, Callable[[Any, str, str], dict | None]] = {
    "response_format": _response_format,
    "structured_outputs": _structured_outputs,
    "guided_json": _schema,
    "json_schema": _schema,
    "guided_regex": _regex,
    "regex": _regex,
    "guided_choice": _choice,
    "guided_grammar": _grammar,
    "ebnf": _grammar,
    "grammar": _grammar,
}
#: the fields that ask for an output format (a request names at most one)
GUIDED_FIELDS = tuple(_READERS)
