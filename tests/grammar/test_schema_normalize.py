"""normalize_schema: equivalent schemas whose assertions xgrammar enforces.

Each scenario checks the rewrite through xgrammar itself (xgrammar.testing needs no tokenizer): the
original schema's grammar lets a violation through or refuses a valid instance, the normalized one does
not, and jsonschema agrees with the normalized grammar.
"""

from __future__ import annotations

import copy
import json

import pytest
import xgrammar as xgr
from grammar_support import grammar_accepts, jsonschema_accepts, make_grammar
from specexec.grammar.schema.normalize import anchor_pattern, fold_lengths, normalize_schema
from specexec.grammar.schema.support import find_unsupported
from xgrammar.testing import _is_grammar_accept_string

AB = {"a": {"type": "integer"}, "b": {"type": "integer"}}


def assert_enforced(schema, valid: list, invalid: list) -> dict:
    """The normalized schema's grammar agrees with jsonschema (on the original) on every instance."""
    normalized = normalize_schema(schema)
    for instance in valid:
        assert jsonschema_accepts(schema, instance), instance
        assert grammar_accepts(normalized, instance), instance
    for instance in invalid:
        assert not jsonschema_accepts(schema, instance), instance
        assert not grammar_accepts(normalized, instance), instance
    return normalized


def test_anyof_with_sibling_required_becomes_enforced():
    schema = {
        "type": "object",
        "properties": AB,
        "required": ["b"],
        "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    assert grammar_accepts(schema, {"a": 1}), "xgrammar drops the sibling required"
    normalized = assert_enforced(
        schema, valid=[{"b": 1}, {"a": 1, "b": 2}], invalid=[{"a": 1}, {}, {"b": "x"}]
    )
    assert list(normalized) == ["anyOf"]
    assert [b["required"] for b in normalized["anyOf"]] == [["b", "a"], ["b"]]
    assert all(b["properties"] == AB and b["type"] == "object" for b in normalized["anyOf"])
    assert find_unsupported(normalized) == []


def test_oneof_siblings_go_into_every_branch():
    schema = {
        "type": "object",
        "properties": {"kind": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["kind"],
        "oneOf": [
            {"properties": {"kind": {"const": "a"}}},
            {"properties": {"kind": {"const": "b"}}, "required": ["n"]},
        ],
    }
    assert grammar_accepts(schema, {}), "xgrammar drops the sibling required"
    assert_enforced(
        schema, valid=[{"kind": "a"}, {"kind": "b", "n": 1}], invalid=[{}, {"kind": "b"}, {"kind": "c"}]
    )


def test_branch_that_contradicts_the_siblings_is_dropped():
    schema = {"type": "string", "anyOf": [{"type": "integer"}, {"minLength": 2}]}
    normalized = assert_enforced(schema, valid=["ab"], invalid=[1, "a"])
    assert normalized == {"type": "string", "pattern": '^[^"\\\\\\x00-\\x1f]{2,}$'}


def test_string_lengths_become_a_pattern_without_control_characters():
    """xgrammar's own length rule lets a raw control character into the string: invalid JSON text."""

    schema = {"type": "string", "maxLength": 3}
    normalized = assert_enforced(schema, valid=["", "ab", "a b"], invalid=["abcd"])
    assert "maxLength" not in normalized and normalized["pattern"].endswith("{0,3}$")
    raw = '"a\x1ab"'  # a JSON text with a raw control character in its string
    before = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    after = xgr.Grammar.from_json_schema(json.dumps(normalized), any_whitespace=False)
    assert _is_grammar_accept_string(before, raw) and not _is_grammar_accept_string(after, raw)


def test_boolean_branches():
    assert normalize_schema({"type": "integer", "anyOf": [False, {"minimum": 3}]}) == {
        "type": "integer",
        "minimum": 3,
    }
    assert normalize_schema({"type": "integer", "anyOf": [True, {"minimum": 3}]}) == {"type": "integer"}


def test_allof_merges_properties_required_and_bounds():
    schema = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
            {"properties": {"a": {"maximum": 10}, "b": {"type": "string"}}, "required": ["b"]},
        ]
    }
    assert grammar_accepts(schema, {"a": -1}), "xgrammar lets an allOf with several branches match anything"
    normalized = assert_enforced(
        schema,
        valid=[{"a": 0, "b": "x"}, {"a": 10, "b": ""}],
        invalid=[{"a": -1, "b": "x"}, {"a": 11, "b": "x"}, {"a": 1}],
    )
    assert normalized == {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 10}, "b": {"type": "string"}},
        "required": ["a", "b"],
    }


def test_allof_intersects_types_and_enums():
    schema = {
        "allOf": [{"type": ["integer", "string"]}, {"type": ["number", "null"]}, {"enum": [1, 2.5, "x", 3]}]
    }
    assert normalize_schema(schema) == {"enum": [1, 3]}


def test_allof_undeclared_property_takes_additional_properties():
    schema = {
        "allOf": [
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "additionalProperties": {"type": "integer"},
            },
            {"properties": {"b": {"minimum": 5}}},
        ]
    }
    assert_enforced(schema, valid=[{"a": 1, "b": 5}], invalid=[{"b": 4}, {"b": "x"}])


def test_allof_that_cannot_merge_is_left_for_find_unsupported():
    schema = {"allOf": [{"type": "string", "pattern": p} for p in ("^a", "b$", "c")]}
    normalized = normalize_schema(schema)
    assert len(normalized["allOf"]) == 2
    assert "allOf" in {u.keyword for u in find_unsupported(normalized)}


def test_allof_branch_ref_is_inlined():
    schema = {
        "$defs": {
            "named": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
        },
        "allOf": [
            {"$ref": "#/$defs/named"},
            {"properties": {"age": {"type": "integer"}}, "required": ["age"]},
        ],
    }
    normalized = assert_enforced(schema, valid=[{"name": "x", "age": 1}], invalid=[{"name": "x"}, {"age": 1}])
    assert normalized["properties"] == {"name": {"type": "string"}, "age": {"type": "integer"}}


def test_ref_sibling_implied_by_target_keeps_the_ref():
    schema = {
        "$defs": {"o": {"type": "object", "properties": AB}},
        "type": "object",
        "oneOf": [{"$ref": "#/$defs/o"}],
    }
    assert normalize_schema(schema)["$ref"] == "#/$defs/o"


def test_ref_siblings_are_ignored_in_draft_7():
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"s": {"type": "string"}},
        "type": "object",
        "properties": {"a": {"$ref": "#/definitions/s", "maxLength": 1}},
    }
    normalized = assert_enforced(schema, valid=[{"a": "long"}], invalid=[{"a": 1}])
    assert normalized["properties"]["a"] == {"$ref": "#/definitions/s"}


def test_recursive_ref_schema_survives():
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["name"],
            }
        },
        "$ref": "#/$defs/node",
        "required": ["children"],
    }
    normalized = assert_enforced(
        tree,
        valid=[
            {"name": "r", "children": []},
            {"name": "r", "children": [{"name": "c", "children": [{"name": "g"}]}]},
        ],
        invalid=[{"name": "r"}, {"name": "r", "children": [{"children": []}]}],
    )
    assert normalized["properties"]["children"]["items"] == {"$ref": "#/$defs/node"}
    assert normalize_schema(normalized) == normalized


def test_self_reference_with_siblings_stays_a_reference():
    schema = {
        "type": "object",
        "properties": {"next": {"$ref": "#", "required": ["v"]}, "v": {"type": "integer"}},
    }
    normalized = normalize_schema(schema)
    assert normalized["properties"]["next"] == {"$ref": "#", "required": ["v"]}
    assert normalize_schema(normalized) == normalized
    assert "required" in {u.keyword for u in find_unsupported(normalized)}


def test_deep_ref_target_is_copied_to_defs():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 1}, "b": {"$ref": "#/properties/a"}},
        "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    normalized = assert_enforced(schema, valid=[{"b": 2}], invalid=[{"b": 0}, {}])
    assert normalized["$defs"] == {"_ref0": {"type": "integer", "minimum": 1}}


def test_enum_is_filtered_by_its_siblings():
    schema = {"type": "string", "enum": ["a", 1, "bb"], "maxLength": 1}
    assert grammar_accepts(schema, 1)
    normalized = assert_enforced(schema, valid=["a"], invalid=[1, "bb"])
    assert normalized == {"enum": ["a"]}


def test_disjoint_oneof_becomes_anyof():
    schema = {"oneOf": [{"type": "integer", "maximum": 0}, {"type": "integer", "minimum": 1}]}
    assert normalize_schema(schema) == {"anyOf": schema["oneOf"]}


def test_overlapping_oneof_stays():
    schema = {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 10}]}
    assert normalize_schema(schema) == schema


def test_required_names_are_declared():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}
    assert grammar_accepts(schema, {"a": 1}) and not grammar_accepts(schema, {"a": 1, "b": 2})
    normalized = assert_enforced(schema, valid=[{"a": 1, "b": 2}, {"b": [1]}], invalid=[{"a": 1}])
    assert list(normalized["properties"]) == ["a", "b"]


def test_required_name_matching_pattern_properties_gets_their_schema():
    schema = {"type": "object", "patternProperties": {"^x_": {"type": "integer"}}, "required": ["x_1"]}
    assert_enforced(schema, valid=[{"x_1": 1}], invalid=[{}, {"x_1": "s"}])


def test_untyped_keywords_are_split_by_type():
    schema = {"minLength": 2, "minimum": 3}
    assert grammar_accepts(schema, "a") and grammar_accepts(schema, 1)
    assert_enforced(schema, valid=["ab", 3, None, [1], {"k": 1}], invalid=["a", 1])


def test_not_type_becomes_the_complementary_type():
    schema = {"not": {"type": ["object", "array"]}}
    assert grammar_accepts(schema, [1])
    normalized = assert_enforced(schema, valid=[1, "x", None, True], invalid=[[1], {}])
    assert normalized == {"type": ["null", "boolean", "number", "string"]}


def test_number_with_whole_multiple_of_is_an_integer():
    schema = {"type": "number", "multipleOf": 1, "minimum": 1, "maximum": 5}
    assert grammar_accepts(schema, 1.5)
    assert normalize_schema(schema) == {"type": "integer", "minimum": 1, "maximum": 5}


@pytest.mark.parametrize(
    ("step", "normalized"), [(1.5, {"multipleOf": 3}), (0.25, {}), (2.0, {"multipleOf": 2})]
)
def test_integer_multiple_of_a_fraction_is_its_numerator(step, normalized):
    schema = {"type": "integer", "multipleOf": step}
    assert normalize_schema(schema) == {"type": "integer", **normalized}


def test_integer_multiple_of_a_fraction_becomes_enforced():
    schema = {"type": "integer", "multipleOf": 1.5}
    assert grammar_accepts(schema, 4), "xgrammar ignores a multipleOf that is not whole"
    assert_enforced(schema, valid=[3, 6, 0], invalid=[4, 1])


def test_integer_bounds_that_are_not_whole_are_rounded_inwards():
    schema = {"type": "integer", "minimum": 1.5, "exclusiveMaximum": 4.5}
    with pytest.raises(RuntimeError):
        make_grammar(schema)
    normalized = assert_enforced(schema, valid=[2, 4], invalid=[1, 5])
    assert normalized == {"type": "integer", "minimum": 2, "maximum": 4}


def test_lengths_next_to_a_pattern_are_folded_into_it():
    schema = {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}
    assert grammar_accepts(schema, "abcd"), "xgrammar ignores lengths next to a pattern"
    normalized = assert_enforced(schema, valid=["abc", "a"], invalid=["abcd", ""])
    assert normalized == {"type": "string", "pattern": "^[a-z]{1,3}$"}


def test_lengths_implied_by_the_pattern_are_dropped():
    schema = {"type": "string", "pattern": "^[0-9]{16}$", "minLength": 15, "maxLength": 16}
    assert normalize_schema(schema) == {"type": "string", "pattern": "^[0-9]{16}$"}


@pytest.mark.parametrize(
    ("pattern", "low", "high", "folded"),
    [
        ("^a*$", 2, None, "^a{2,}$"),
        (r"^\d{2,8}$", 3, 5, r"^\d{3,5}$"),
        ("^[ab]?$", 0, 0, "^[ab]{0,0}$"),
        ("^(ab)+$", 0, 3, None),
        ("^a+$", 4, 2, None),
        ("[0-9]{10}", 0, 10, "^[0-9]{10}$"),
        ("[0-9]{10}", 0, 11, None),
    ],
)
def test_fold_lengths(pattern, low, high, folded):
    assert fold_lengths(pattern, low, high) == folded


def test_format_that_hides_a_pattern_is_dropped():
    schema = {"type": "string", "format": "uri", "pattern": "^mailto:"}
    assert grammar_accepts(schema, "http://example.com"), (
        "xgrammar matches the format and ignores the pattern"
    )
    assert_enforced(schema, valid=["mailto:x@example.com"], invalid=["http://example.com"])


@pytest.mark.parametrize(
    ("pattern", "anchored"),
    [
        ("^mailto:", r"^mailto:[\s\S]*$"),
        ("abc$", r"^[\s\S]*abc$"),
        ("a|b", r"^[\s\S]*(?:a|b)[\s\S]*$"),
        ("^a$", "^a$"),
        ("^a|b$", "^a|b$"),
        (r"a\$", r"^[\s\S]*a\$[\s\S]*$"),
        ("[$^]", r"^[\s\S]*[$^][\s\S]*$"),
    ],
)
def test_anchor_pattern(pattern, anchored):
    assert anchor_pattern(pattern) == anchored


def test_unanchored_pattern_matches_as_a_search():
    schema = {"type": "string", "pattern": "^mailto:"}
    assert not grammar_accepts(schema, "mailto:x"), "xgrammar matches the whole string"
    assert_enforced(schema, valid=["mailto:x", "mailto:"], invalid=["x"])


@pytest.mark.parametrize(
    ("schema", "valid"),
    [({"type": "array", "maxItems": 3}, [1, "x"]), ({"type": "object", "maxProperties": 2}, {"k": [1]})],
)
def test_containers_without_members_are_opened(schema, valid):
    assert not grammar_accepts(schema, valid), "xgrammar's strict mode allows only [] or {}"
    assert_enforced(schema, valid=[valid], invalid=[])


def test_min_items_without_items_compiles():
    schema = {"type": "array", "minItems": 2}
    with pytest.raises(RuntimeError):
        make_grammar(schema)
    assert_enforced(schema, valid=[[1, "x"]], invalid=[[1]])


def test_draft_4_exclusive_minimum_and_draft_7_items_array():
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "array",
        "items": [{"type": "integer", "minimum": 0, "exclusiveMinimum": True}],
        "additionalItems": False,
    }
    with pytest.raises(RuntimeError):
        make_grammar(schema)
    normalized = assert_enforced(schema, valid=[[1], []], invalid=[[0], [1, 2]])
    assert normalized["prefixItems"] == [{"type": "integer", "exclusiveMinimum": 0}]


def test_unknown_keywords_are_dropped():
    schema = {"type": "object", "x-go-type": "map", "nullable": True}
    assert not grammar_accepts(schema, {"k": 1}), "xgrammar closes objects with unknown keywords"
    assert normalize_schema(schema) == {"type": "object", "additionalProperties": {}}


def test_properties_keep_their_declared_order():
    schema = {
        "type": "object",
        "properties": {"z": {"type": "integer"}, "m": {"type": "integer"}, "a": {"type": "integer"}},
        "required": ["a"],
        "anyOf": [{"properties": {"q": {"type": "string"}}, "required": ["q"]}, {"required": ["z"]}],
    }
    normalized = normalize_schema(schema)
    assert [list(b["properties"]) for b in normalized["anyOf"]] == [["z", "m", "a", "q"], ["z", "m", "a"]]


def test_input_is_not_mutated():
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "definitions": {"n": {"type": "integer", "minimum": 0, "exclusiveMinimum": True}},
        "type": "object",
        "properties": {
            "a": {"$ref": "#/definitions/n"},
            "b": {"$ref": "#/properties/a"},
            "c": {"items": [{}]},
        },
        "allOf": [{"required": ["a"]}, {"anyOf": [{"required": ["b"]}, {"required": ["c"]}]}],
        "dependencies": {"a": ["b"]},
    }
    before = copy.deepcopy(schema)
    normalized = normalize_schema(schema)
    assert schema == before
    assert not containers(schema) & containers(normalized), "the result shares no dict or list with the input"


def containers(value) -> set[int]:
    """ids of every dict and list in a JSON value."""
    if isinstance(value, dict):
        return {id(value)}.union(*(containers(v) for v in value.values()))
    if isinstance(value, list):
        return {id(value)}.union(*(containers(v) for v in value))
    return set()


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": AB,
            "required": ["b"],
            "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
        },
        {
            "allOf": [
                {"oneOf": [{"type": "integer"}, {"type": "string"}]},
                {"oneOf": [{"minimum": 1}, {"minLength": 1}]},
            ]
        },
        {
            "$defs": {"t": {"type": "object", "properties": {"c": {"$ref": "#/$defs/t"}}}},
            "$ref": "#/$defs/t",
            "minProperties": 1,
        },
        {"type": "string", "pattern": "a|b", "format": "email", "maxLength": 3},
        {"minLength": 2, "required": ["a"], "not": {"type": "null"}},
    ],
)
def test_normalizing_twice_is_normalizing_once(schema):
    once = normalize_schema(schema)
    assert normalize_schema(once) == once


def test_non_dict_schema_raises_value_error_naming_the_field():
    with pytest.raises(ValueError, match="schema must be a JSON object"):
        normalize_schema(True)  # type: ignore[arg-type]
