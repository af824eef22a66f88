"""What a request's output must match: a grammar kind plus its canonical source text."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json_schema", "json_object", "regex", "ebnf", "choice", "structural_tag")
#: most strings one ``choice`` format lists
MAX_CHOICES = 1024


class GrammarError(ValueError):
    """A response_format or grammar is malformed, does not compile, or a token broke the grammar."""


def canonical_json(obj: Any) -> str:
    """Compact JSON text used as the cache key and compile input.

    Keys keep their declared order (no sort_keys): xgrammar emits object properties in the schema's
    declared order, so sorting would change which outputs the grammar allows.
    """
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    kind: str  # one of KINDS
    #: canonical source: schema / structural-tag JSON, regex, EBNF, the choices' JSON list; "" for json_object
    text: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"unknown grammar kind {self.kind!r}; allowed: {', '.join(KINDS)}")
        if not isinstance(self.text, str):
            raise GrammarError(f"grammar text must be a str, got {type(self.text).__name__}")

    @classmethod
    def from_response_format(cls, rf: Any) -> GrammarSpec | None:
        """Parse an OpenAI-style `response_format`; None for `{"type": "text"}` (unconstrained)."""
        if not isinstance(rf, dict):
            raise GrammarError(f"response_format must be an object, got {type(rf).__name__}")
        kind = rf.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return cls("json_object", "")
        if kind == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict):
                raise GrammarError('response_format type "json_schema" needs a "json_schema" object')
            schema = js.get("schema")
            if not isinstance(schema, dict):
                raise GrammarError('response_format.json_schema needs a "schema" object (the JSON schema)')
            return cls("json_schema", canonical_json(schema))
        if kind == "regex":
            return cls("regex", _nonempty_str(rf, "regex"))
        if kind == "grammar":
            return cls("ebnf", _nonempty_str(rf, "grammar"))
        if kind == "choice":
            return cls("choice", canonical_json(_choices(rf)))
        if kind == "structural_tag":
            return cls("structural_tag", canonical_json(_structural_tag(rf)))
        allowed = "text, json_object, json_schema, regex, grammar, choice, structural_tag"
        raise GrammarError(f"unsupported response_format type {kind!r}; allowed: {allowed}")


def _nonempty_str(rf: dict, key: str) -> str:
    value = rf.get(key)
    if not isinstance(value, str) or not value:
        raise GrammarError(f'response_format type "{rf["type"]}" needs a non-empty string "{key}"')
    return value


def _choices(rf: dict) -> list[str]:
    """``{"type": "choice", "choice": [...]}``: the output is exactly one of these strings."""
    choices = rf.get("choice")
    if (
        not isinstance(choices, list)
        or not 1 <= len(choices) <= MAX_CHOICES
        or not all(isinstance(c, str) for c in choices)
    ):
        raise GrammarError(f'response_format type "choice" needs a "choice" list of 1..{MAX_CHOICES} strings')
    return choices


def choice_ebnf(choices: list[str]) -> str:
    """The EBNF grammar whose only sentences are ``choices``: an alternation of string literals, each
    written as JSON writes it (xgrammar's EBNF reads JSON's escapes, control characters included)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _structural_tag(rf: dict) -> dict:
    """The xgrammar structural-tag dict; the legacy structures/triggers shape is converted."""
    if isinstance(rf.get("format"), dict):
        return {"type": "structural_tag", "format": rf["format"]}
    structures, triggers = rf.get("structures"), rf.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list):
        raise GrammarError(
            'response_format type "structural_tag" needs a "format" object '
            '(or the legacy "structures" and "triggers" lists)'
        )
    tags = []
    for i, s in enumerate(structures):
        if not (isinstance(s, dict) and isinstance(s.get("begin"), str) and isinstance(s.get("end"), str)):
            raise GrammarError(f"structural_tag structures[{i}] needs string begin and end")
        if not isinstance(s.get("schema"), dict):
            raise GrammarError(f'structural_tag structures[{i}] needs a "schema" object')
        content = {"type": "json_schema", "json_schema": s["schema"]}
        tags.append({"type": "tag", "begin": s["begin"], "content": content, "end": s["end"]})
    fmt = {"type": "triggered_tags", "triggers": triggers, "tags": tags}
    return {"type": "structural_tag", "format": fmt}
