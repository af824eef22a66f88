"""check_guided_output: the independent verdict on a finished guided output."""

from __future__ import annotations

import dataclasses
import json

import pytest
from specexec.grammar.output_check import GuidedVerdict, check_guided_output

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name"],
}


def check_schema(schema, output: str) -> GuidedVerdict:
    return check_guided_output("json_schema", json.dumps(schema), output)


def test_valid_output_has_no_error():
    assert check_schema(PERSON, '{"name": "Ada", "age": 36}') == GuidedVerdict(True, None)


def test_invalid_output_names_the_path_and_the_keyword():
    verdict = check_schema(PERSON, '{"name": "Ada", "age": -1}')
    assert verdict.valid is False
    assert verdict.error.startswith("at /age:") and "minimum" in verdict.error


def test_missing_required_property_is_reported_at_the_root():
    verdict = check_schema(PERSON, '{"age": 3}')
    assert verdict.valid is False and verdict.error == "at the root: 'name' is a required property"


def test_anyof_with_sibling_required_is_checked_as_written():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["b"],
        "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    assert check_schema(schema, '{"a": 1}').valid is False
    assert check_schema(schema, '{"b": 1}').valid is True


def test_path_parts_are_escaped_as_a_json_pointer():
    schema = {"type": "object", "properties": {"a/b": {"type": "integer"}}}
    assert check_schema(schema, '{"a/b": "x"}').error.startswith("at /a~1b:")


def test_pattern_python_warns_about_is_checked():
    """Python warns (FutureWarning) on "[[" in a pattern; the tests turn warnings into errors."""
    schema = {"type": "string", "pattern": "^[[a-z]+$"}
    assert check_schema(schema, '"[ab"').valid is True
    assert check_schema(schema, '"1"').valid is False


def test_output_that_is_not_json_is_invalid():
    verdict = check_schema(PERSON, '{"name": "Ada"')
    assert verdict.valid is False and verdict.error.startswith("not valid JSON")


@pytest.mark.parametrize("output", ['{"name": NaN}', '{"name": "a", "age": Infinity}'])
def test_nan_and_infinity_are_not_json(output):
    assert check_schema({}, output).valid is False


def test_duplicate_keys_are_invalid():
    """json.loads would keep the last value and hide an invalid first one."""
    verdict = check_schema(PERSON, '{"name": "Ada", "age": -1, "age": 2}')
    assert verdict == GuidedVerdict(False, "not valid JSON: duplicate key 'age'")


def test_schema_dialect_follows_dollar_schema():
    """Draft 4's boolean exclusiveMinimum makes the minimum exclusive; 2020-12 would reject the schema."""
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "integer",
        "minimum": 3,
        "exclusiveMinimum": True,
    }
    assert check_schema(schema, "3").valid is False
    assert check_schema(schema, "4").valid is True


def test_unknown_dollar_schema_falls_back_to_2020_12_without_warning():
    schema = {"$schema": "https://example.com/my-dialect", "prefixItems": [{"type": "integer"}]}
    assert check_schema(schema, '["x"]').valid is False


def test_boolean_schemas():
    assert check_guided_output("json_schema", "true", "[1]").valid is True
    assert check_guided_output("json_schema", "false", "[1]").valid is False


def test_bad_schema_text_is_a_verdict_not_an_exception():
    verdict = check_guided_output("json_schema", "{not json", "{}")
    assert verdict.valid is None and "schema is not valid JSON" in verdict.error


def test_schema_with_unknown_type_cannot_be_checked():
    verdict = check_schema({"type": "colour"}, '"red"')
    assert verdict.valid is None and "UnknownType" in verdict.error


def test_remote_ref_is_not_fetched():
    verdict = check_schema({"$ref": "https://example.invalid/schema.json"}, "{}")
    assert verdict.valid is None and "Unresolvable" in verdict.error


def test_long_messages_are_cut():
    verdict = check_schema({"enum": ["x" * 500]}, json.dumps("y" * 500))
    assert verdict.valid is False and len(verdict.error) <= 240


@pytest.mark.parametrize(
    ("output", "valid"), [('{"a": [1]}', True), ("{}", True), ("[1]", False), ('"x"', False)]
)
def test_json_object_must_be_an_object(output, valid):
    assert check_guided_output("json_object", "", output).valid is valid


def test_json_object_names_what_it_got():
    assert check_guided_output("json_object", "", "[1]").error == "not a JSON object but an array"


@pytest.mark.parametrize(
    ("output", "valid"), [("2024-01-31", True), ("2024-01-31x", False), ("x2024-01-31", False)]
)
def test_regex_must_match_the_whole_output(output, valid):
    verdict = check_guided_output("regex", r"\d{4}-\d{2}-\d{2}", output)
    assert verdict.valid is valid
    assert (verdict.error is None) is valid


def test_regex_python_cannot_compile_is_unchecked():
    assert check_guided_output("regex", "(?<year>\\d+)", "2024").valid is True  # ECMA named group: fine
    verdict = check_guided_output("regex", "(unclosed", "unclosed")
    assert verdict.valid is None and "cannot compile" in verdict.error


def test_a_catastrophic_pattern_is_bounded_in_time():
    import json
    import time

    start = time.perf_counter()
    regex_verdict = check_guided_output("regex", "(x+x+)+y", "x" * 5000)
    schema_verdict = check_guided_output(
        "json_schema", json.dumps({"pattern": "^(x+x+)+y$"}), json.dumps("x" * 5000)
    )
    assert time.perf_counter() - start < 5
    assert regex_verdict.valid is None and "took over" in regex_verdict.error
    assert schema_verdict.valid is None and "took over" in schema_verdict.error


@pytest.mark.parametrize("kind", ["ebnf", "structural_tag"])
def test_ebnf_and_structural_tag_have_no_checker(kind):
    verdict = check_guided_output(kind, 'root ::= "a"', "a")
    assert verdict.valid is None and kind in verdict.error


def test_unknown_kind_is_a_verdict():
    assert check_guided_output("yaml", "", "a: 1").valid is None


def test_never_raises_on_non_string_input():
    assert check_guided_output("json_schema", None, "{}").valid is None  # type: ignore[arg-type]


def test_verdict_is_a_frozen_slots_dataclass():
    verdict = GuidedVerdict(True, None)
    assert not hasattr(verdict, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.valid = False  # type: ignore[misc]
