"""find_unsupported: what xgrammar 0.2.8 compiles but does not enforce, each with its evidence.

Evidence is an instance that jsonschema rejects and the compiled grammar accepts; xgrammar's own testing
helpers need no tokenizer. Run this file as a script to check every JSONSchemaBench split:
``PYTHONPATH=tests python tests/grammar/test_schema_support.py``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections import Counter

import pytest
from grammar_support import grammar_accepts, jsonschema_accepts, make_grammar
from specexec.grammar.schema.normalize import normalize_schema
from specexec.grammar.schema.support import UnsupportedKeyword, find_unsupported
from specexec.prompt_sets.datasets import DATA_DIR, JSONSCHEMABENCH_SPLITS
from xgrammar.testing import _is_grammar_accept_string

AB = {"a": {"type": "integer"}, "b": {"type": "string"}}


def reported_keywords(schema) -> set[str]:
    return {u.keyword for u in find_unsupported(schema)}


# (keyword reported, schema, instance that jsonschema rejects and xgrammar accepts after normalization)
NOT_ENFORCED = [
    ("not", {"type": "integer", "not": {"const": 3}}, 3),
    (
        "if",
        {"type": "object", "properties": AB, "if": {"required": ["a"]}, "then": {"required": ["b"]}},
        {"a": 1},
    ),
    ("dependentRequired", {"type": "object", "properties": AB, "dependentRequired": {"a": ["b"]}}, {"a": 1}),
    (
        "dependentSchemas",
        {"type": "object", "properties": AB, "dependentSchemas": {"a": {"required": ["b"]}}},
        {"a": 1},
    ),
    (
        "dependentRequired",  # draft 7's dependencies, as normalize_schema writes it
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": AB,
            "dependencies": {"a": ["b"]},
        },
        {"a": 1},
    ),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 1]),
    ("multipleOf", {"type": "number", "multipleOf": 0.5}, 0.3),
    ("multipleOf", {"type": "integer", "multipleOf": 3, "minimum": 0}, 4),
    ("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}}, [1]),
    (
        "minContains",
        {"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}, "minContains": 2},
        [1, 1],
    ),
    (
        "maxContains",
        {"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}, "maxContains": 1},
        [3, 3],
    ),
    ("oneOf", {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 10}]}, 5),
    ("oneOf", {"type": "object", "oneOf": [{"properties": {"dog": {}}}, {"properties": {"cat": {}}}]}, {}),
    ("pattern", {"allOf": [{"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "b$"}]}, "xb"),
    ("allOf", {"allOf": [{"type": "string", "pattern": p} for p in ("^a", "b$", "c")]}, 5),
    ("pattern", {"type": "string", "pattern": "^(?!x)[a-z]+$"}, "xa"),
    ("maxLength", {"type": "string", "pattern": "^(ab|c)+$", "maxLength": 3}, "ababab"),
    ("minLength", {"type": "string", "pattern": "^(ab|c)+$", "minLength": 2}, "c"),
    ("type", {"type": "object", "enum": ["a"]}, "a"),
    (
        "required",
        {"type": "object", "properties": {"a": {}}, "additionalProperties": False, "required": ["b"]},
        {"a": 1},
    ),
    (
        "patternProperties",
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "patternProperties": {"^[a-z]+$": {"type": "string"}},
        },
        {"id": "x"},
    ),
    (
        "$ref",
        {
            "$id": "https://example.test/s.json",
            "$defs": {"i": {"type": "integer"}},
            "type": "object",
            "properties": {"a": {"$ref": "s.json#/$defs/i"}},
        },
        {"a": "x"},
    ),
    (
        "$ref",
        {
            "$defs": {"i": {"$anchor": "int", "type": "integer"}},
            "type": "object",
            "properties": {"a": {"$ref": "#int"}},
        },
        {"a": "x"},
    ),
    (
        "$dynamicRef",
        {
            "$defs": {"i": {"$dynamicAnchor": "n", "type": "integer"}},
            "type": "object",
            "properties": {"a": {"$dynamicRef": "#n"}},
        },
        {"a": "x"},
    ),
    (
        "required",  # a recursive $ref with siblings: never inlined, so xgrammar drops the siblings
        {
            "$defs": {
                "n": {
                    "type": "object",
                    "properties": {
                        "v": {"type": "integer"},
                        "next": {"$ref": "#/$defs/n", "required": ["v"]},
                    },
                }
            },
            "$ref": "#/$defs/n",
        },
        {"next": {}},
    ),
]


@pytest.mark.parametrize(("keyword", "schema", "instance"), NOT_ENFORCED, ids=[c[0] for c in NOT_ENFORCED])
def test_reported_keyword_is_really_not_enforced(keyword, schema, instance):
    normalized = normalize_schema(schema)
    assert not jsonschema_accepts(schema, instance)
    assert grammar_accepts(normalized, instance), "the evidence: xgrammar lets the violation through"
    assert keyword in reported_keywords(normalized)


# (keyword, schema, instance that violates it: xgrammar rejects it and nothing is reported)
ENFORCED = [
    ("type", {"type": "integer"}, "1"),
    ("enum", {"enum": ["a", "b"]}, "c"),
    ("const of an object", {"const": {"a": 1}}, {"a": 2}),
    ("enum of objects", {"enum": [{"a": 1}, [1, 2]]}, [2, 1]),
    ("minimum on numbers", {"type": "number", "minimum": 1.5}, 1.4),
    ("maximum on numbers", {"type": "number", "maximum": 1.5}, 1.6),
    ("exclusiveMinimum on integers", {"type": "integer", "exclusiveMinimum": 3}, 3),
    ("exclusiveMaximum on integers", {"type": "integer", "exclusiveMaximum": 3}, 3),
    ("exclusiveMinimum on numbers", {"type": "number", "exclusiveMinimum": 0}, 0),
    ("exclusiveMaximum on numbers", {"type": "number", "exclusiveMaximum": 3.5}, 3.5),
    ("multipleOf on integers", {"type": "integer", "multipleOf": 3}, 4),
    ("minLength", {"type": "string", "minLength": 2}, "a"),
    ("maxLength", {"type": "string", "maxLength": 2}, "abc"),
    ("pattern", {"type": "string", "pattern": "^a+$"}, "b"),
    ("items", {"type": "array", "items": {"type": "integer"}}, ["a"]),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, [1, 2]),
    ("minItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2}, [1]),
    ("maxItems", {"type": "array", "items": {"type": "integer"}, "maxItems": 1}, [1, 2]),
    ("required", {"type": "object", "properties": AB, "required": ["a"]}, {"b": "x"}),
    ("additionalProperties", {"type": "object", "additionalProperties": {"type": "integer"}}, {"a": "x"}),
    ("patternProperties", {"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, {"xa": "s"}),
    ("propertyNames", {"type": "object", "propertyNames": {"maxLength": 2}}, {"abc": 1}),
    (
        "minProperties",
        {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
        {"a": 1},
    ),
    (
        "maxProperties",
        {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1},
        {"a": 1, "b": 2},
    ),
    (
        "unevaluatedProperties",
        {"type": "object", "properties": AB, "unevaluatedProperties": {"type": "string"}},
        {"c": 1},
    ),
    (
        "unevaluatedItems",
        {"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": False},
        [1, 2],
    ),
    ("anyOf", {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "maximum": 3}]}, 5),
    ("oneOf over distinct types", {"oneOf": [{"type": "string"}, {"type": "integer"}]}, 1.5),
    (
        "oneOf with a discriminator",
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"k": {"const": "a"}, "x": {"type": "integer"}},
                    "required": ["k"],
                },
                {
                    "type": "object",
                    "properties": {"k": {"const": "b"}, "x": {"type": "string"}},
                    "required": ["k"],
                },
            ]
        },
        {"k": "a", "x": "s"},
    ),
    ("allOf that merges", {"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 10}]}, 11),
    (
        "local $ref",
        {"$defs": {"i": {"type": "integer"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/i"}}},
        {"a": "x"},
    ),
    ("not a type", {"not": {"type": ["string", "null"]}}, None),
    ("dependentRequired under additionalProperties false", {"type": "object", "properties": AB}, {"a": "x"}),
]


@pytest.mark.parametrize(("keyword", "schema", "instance"), ENFORCED, ids=[c[0] for c in ENFORCED])
def test_enforced_keyword_is_not_reported(keyword, schema, instance):
    normalized = normalize_schema(schema)
    assert not jsonschema_accepts(schema, instance)
    assert not grammar_accepts(normalized, instance)
    assert find_unsupported(normalized) == []


def test_anyof_siblings_are_reported_before_normalization_only():
    """The motivating case: xgrammar reads anyOf and drops the sibling ``required``."""
    schema = {
        "type": "object",
        "properties": AB,
        "required": ["b"],
        "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    assert {"type", "properties", "required"} <= reported_keywords(schema)
    assert grammar_accepts(schema, {"a": 1}) and not jsonschema_accepts(schema, {"a": 1})
    assert find_unsupported(normalize_schema(schema)) == []


def test_untyped_keywords_are_reported_before_normalization_only():
    schema = {"minLength": 2}
    assert reported_keywords(schema) == {"minLength"}
    assert grammar_accepts(schema, "a")
    assert not grammar_accepts(normalize_schema(schema), "a")
    assert find_unsupported(normalize_schema(schema)) == []


def test_format_hides_pattern_and_lengths_before_normalization_only():
    schema = {"type": "string", "format": "email", "pattern": "^[a-z@.]+$", "maxLength": 8}
    assert reported_keywords(schema) == {"pattern", "maxLength"}
    assert grammar_accepts(schema, "bbbbbbbbbb@example.com")
    assert not grammar_accepts(normalize_schema(schema), "bbbbbbbbbb@example.com")
    assert find_unsupported(normalize_schema(schema)) == []


def test_paths_are_json_pointers():
    schema = {
        "type": "object",
        "properties": {
            "a/b": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
            }
        },
    }
    assert find_unsupported(schema) == [
        UnsupportedKeyword("/properties/a~1b/items", "uniqueItems", "xgrammar ignores 'uniqueItems'")
    ]


def test_referenced_definitions_are_checked_once_and_unused_ones_not_at_all():
    schema = {
        "$defs": {
            "used": {"type": "integer", "not": {"const": 1}},
            "unused": {"type": "integer", "not": {"const": 2}},
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/used"}, "b": {"$ref": "#/$defs/used"}},
    }
    assert [(u.path, u.keyword) for u in find_unsupported(schema)] == [("/$defs/used", "not")]


def test_recursive_schema_terminates():
    schema = {
        "type": "object",
        "properties": {"child": {"$ref": "#"}, "n": {"type": "integer", "not": {"const": 0}}},
    }
    assert [(u.path, u.keyword) for u in find_unsupported(schema)] == [("/properties/n", "not")]


def test_unsupported_keyword_is_a_frozen_slots_dataclass():
    found = UnsupportedKeyword("/a", "not", "why")
    assert not hasattr(found, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.path = "/b"  # type: ignore[misc]


def load_split(split: str) -> list[dict]:
    with (DATA_DIR / "jsonschemabench" / f"{split}.jsonl").open() as f:
        return [json.loads(line) for line in f if line.strip()]


def check_split(split: str) -> Counter:
    """Compiles every schema of a split before and after normalization and runs its test instances.

    gaps: invalid instances the normalized grammar accepts although nothing was reported;
    lost: valid instances the original grammar accepts and the normalized one rejects (lost in any
    order: also when the properties may come in any order; xgrammar emits them in declared order).
    """
    counts: Counter = Counter()
    for record in load_split(split):
        schema, normalized_schema = record["schema"], normalize_schema(record["schema"])
        counts["schemas"] += 1
        try:
            original = make_grammar(schema)
        except RuntimeError:
            original = None
        try:
            normalized = make_grammar(normalized_schema)
        except RuntimeError:
            counts["not compiled"] += 1
            continue
        counts["compiled"] += 1
        counts["compiled, not before"] += original is None
        unsupported = find_unsupported(normalized_schema)
        counts["with unsupported keywords"] += bool(unsupported)
        for test in record.get("tests", []):
            text = json.dumps(test["data"])
            accepted = _is_grammar_accept_string(normalized, text)
            accepted_before = original is not None and _is_grammar_accept_string(original, text)
            if not jsonschema_accepts(schema, test["data"]):
                counts["invalid instances"] += 1
                counts["invalid accepted before"] += accepted_before
                counts["invalid accepted, reported"] += accepted and bool(unsupported)
                counts["gaps"] += accepted and not unsupported
                continue
            counts["valid instances"] += 1
            counts["valid accepted before"] += accepted_before
            counts["valid accepted"] += accepted
            if accepted_before and not accepted:
                counts["lost"] += 1
                reordered = make_grammar(normalized_schema, any_order=True)
                counts["lost in any order"] += not _is_grammar_accept_string(reordered, text)
    return counts


def test_github_trivial_split_has_no_gaps():
    """Every schema that compiles and reports nothing rejects every invalid test instance, and accepts
    every valid one the original schema's grammar accepted (normalization removes no valid output)."""
    counts = check_split("Github_trivial")
    assert counts["schemas"] == 300 and counts["not compiled"] == 0
    assert counts["gaps"] == 0
    assert counts["lost"] == 0
    assert counts["valid accepted"] > counts["valid accepted before"]


def test_normalizing_github_trivial_is_pure_and_idempotent():
    for record in load_split("Github_trivial"):
        schema = record["schema"]
        before = json.dumps(schema)
        normalized = normalize_schema(schema)
        assert json.dumps(schema) == before, record["id"]
        assert normalize_schema(normalized) == normalized, record["id"]


def test_normalized_github_trivial_accepts_the_same_instances():
    """normalize_schema is exact: jsonschema's verdicts on the original and the normalized schema agree
    (the split's own labels assert formats; jsonschema does not), except that draft 4 does not count
    1.0 as an integer and 2020-12 does."""
    for record in load_split("Github_trivial"):
        schema, normalized = record["schema"], normalize_schema(record["schema"])
        for test in record.get("tests", []):
            if "draft-04" in schema.get("$schema", "") and has_whole_float(test["data"]):
                continue
            assert jsonschema_accepts(normalized, test["data"]) == jsonschema_accepts(schema, test["data"]), (
                record["id"]
            )


def has_whole_float(value) -> bool:
    if isinstance(value, dict):
        return any(has_whole_float(v) for v in value.values())
    if isinstance(value, list):
        return any(has_whole_float(v) for v in value)
    return isinstance(value, float) and value.is_integer()


if __name__ == "__main__":
    for split in sys.argv[1:] or JSONSCHEMABENCH_SPLITS:
        started = time.perf_counter()
        counts = check_split(split)
        print(f"{split} ({time.perf_counter() - started:.1f} s): {dict(counts)}")
