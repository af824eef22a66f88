"""check_guided_output(): an independent verdict on whether a guided output matches what was asked for.

Guided decoding enforces xgrammar's reading of the request, which leaves some JSON Schema keywords out
(schema_support.py). This module checks the finished output against the request itself: jsonschema for a
JSON schema (the original one, honouring its ``$schema``), ``json.loads`` for a JSON object, a full
match for a regex, membership for a choice. Patterns (a regex, a schema's ``pattern`` and
``patternProperties``) run through the ``regex`` module with a time bound: a catastrophic pattern gives ``valid=None``, never a stalled loop. EBNF grammars and structural tags have no independent checker
(``valid=None``). Duplicate object keys count as invalid: ``json.loads`` would keep only the last value,
and xgrammar can emit a key twice through ``patternProperties``/``additionalProperties``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import regex
from jsonschema import Draft202012Validator, ValidationError
from jsonschema.exceptions import best_match
from jsonschema.validators import extend, validator_for
from referencing import Registry

from .schema.support import has_ref_loop, quiet_regex_warnings

#: seconds one pattern may take on one string (the output is bounded; a pattern's backtracking is not)
PATTERN_TIMEOUT_S = 0.25

_MAX_MESSAGE = 240  # characters of a jsonschema message kept (they quote the whole instance)
_UNCHECKED = ("ebnf", "structural_tag")
_JSON_NAMES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
_JSON_NAMES[type(None)] = "null"


@dataclass(frozen=True, slots=True)
class GuidedVerdict:
    """Whether a guided output matches its request."""

    valid: bool | None  #: None: there is no independent check for this kind, or it could not run
    error: str | None  #: why it is invalid or could not be checked; None when valid


def check_guided_output(kind: str, source_text: str, output_text: str) -> GuidedVerdict:
    """The verdict on ``output_text`` for a request of grammar ``kind``; never raises.

    ``source_text``: the original JSON schema as JSON text for "json_schema", the regex for "regex",
    the choices' JSON list for "choice";
    ignored for "json_object" (any JSON object is valid), "ebnf" and "structural_tag".
    """
    try:
        if kind == "json_schema":
            return _check_json_schema(source_text, output_text)
        if kind == "json_object":
            value, error = _parse_json(output_text)
            if error is None and not isinstance(value, dict):
                error = f"not a JSON object but {_JSON_NAMES.get(type(value), 'a JSON value')}"
            return GuidedVerdict(error is None, error)
        if kind == "regex":
            return _check_regex(source_text, output_text)
        if kind == "choice":
            if output_text in json.loads(source_text):
                return GuidedVerdict(True, None)
            return GuidedVerdict(False, "the output is none of the choices")
        if kind in _UNCHECKED:
            return GuidedVerdict(None, f"no independent checker for {kind!r} outputs")
        return GuidedVerdict(None, f"unknown grammar kind {kind!r}")
    except Exception as exc:  # a verdict, never an exception: this runs on finished requests
        return GuidedVerdict(None, f"could not check: {type(exc).__name__}: {exc}"[:_MAX_MESSAGE])


def _check_json_schema(source_text: str, output_text: str) -> GuidedVerdict:
    try:
        schema = json.loads(source_text)
    except ValueError as exc:
        return GuidedVerdict(None, f"could not check: the schema is not valid JSON ({exc})")
    if not isinstance(schema, (dict, bool)):
        return GuidedVerdict(None, "could not check: the schema is neither an object nor a boolean")
    if has_ref_loop(schema):
        return GuidedVerdict(None, "could not check: the schema's $refs loop without reaching a schema")
    value, error = _parse_json(output_text)
    if error is not None:
        return GuidedVerdict(False, error)
    validator_class = extend(
        validator_for(schema, default=Draft202012Validator),
        {"pattern": _pattern, "patternProperties": _pattern_properties},
    )
    try:
        validator = validator_class(schema, registry=Registry())  # local $refs only, never the network
        with quiet_regex_warnings():
            found = best_match(validator.iter_errors(value))
    except TimeoutError:
        return GuidedVerdict(None, f"could not check: a pattern took over {PATTERN_TIMEOUT_S} s")
    except Exception as exc:  # a malformed keyword or an unresolvable $ref
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        return GuidedVerdict(None, f"could not check: invalid schema ({reason})"[:_MAX_MESSAGE])
    if found is None:
        return GuidedVerdict(True, None)
    where = "".join(f"/{str(part).replace('~', '~0').replace('/', '~1')}" for part in found.absolute_path)
    where = where or "the root"
    return GuidedVerdict(False, f"at {where}: {found.message}"[:_MAX_MESSAGE])


def _check_regex(pattern: str, output_text: str) -> GuidedVerdict:
    try:
        with quiet_regex_warnings():
            compiled = regex.compile(pattern)
    except (regex.error, TypeError) as exc:
        return GuidedVerdict(None, f"could not check: Python cannot compile the regex ({exc})")
    try:
        matched = compiled.fullmatch(output_text, timeout=PATTERN_TIMEOUT_S)
    except TimeoutError:
        return GuidedVerdict(None, f"could not check: the regex took over {PATTERN_TIMEOUT_S} s")
    if matched:
        return GuidedVerdict(True, None)
    return GuidedVerdict(False, "the output does not match the regex")


def _search(pattern: str, text: str) -> bool:
    return regex.search(pattern, text, timeout=PATTERN_TIMEOUT_S) is not None


def _pattern(validator, pattern, instance, schema):
    """jsonschema's ``pattern``, time-bounded."""
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator, patterns, instance, schema):
    """jsonschema's ``patternProperties``, time-bounded."""
    if validator.is_type(instance, "object"):
        for pattern, subschema in patterns.items():
            for key, value in instance.items():
                if _search(pattern, key):
                    yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _parse_json(text: str):
    """(value, None), or (None, why it is not JSON): NaN/Infinity and duplicate keys are not JSON here."""
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys), None
    except ValueError as exc:
        return None, f"not valid JSON: {exc}"


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {duplicate!r}")
    return obj
