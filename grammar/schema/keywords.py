"""The JSON Schema vocabulary as xgrammar 0.2.8 reads it, and small readers of one schema object.

The tables say which keywords assert something, which only describe, which one construct xgrammar reads
in an object (EXCLUSIVE_CONSTRUCTS) and where a schema object holds subschemas. support.py tells
what xgrammar does with them; normalize.py rewrites schemas so that it enforces more of them.
"""

from __future__ import annotations

#: Checked in this order; the first one present is the only assertion xgrammar reads in that object.
EXCLUSIVE_CONSTRUCTS = ("$ref", "const", "enum", "anyOf", "oneOf", "allOf")
#: Formats whose grammar xgrammar builds (any other format matches every string).
FORMATS_XGRAMMAR = frozenset(
    (
        "date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uri-reference",
        "uuid", "uri-template", "json-pointer", "relative-json-pointer",
    )
)  # fmt: skip
#: Keywords that only describe, never reject.
ANNOTATIONS = frozenset(
    (
        "title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly",
        "contentMediaType", "contentEncoding", "contentSchema", "$schema", "$id", "id", "$anchor",
        "$dynamicAnchor", "$recursiveAnchor", "$vocabulary", "$defs", "definitions",
    )
)  # fmt: skip
#: Assertion keywords by the JSON type they apply to ("number" covers integers too).
TYPE_KEYWORDS = {
    "number": ("multipleOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"),
    "string": ("minLength", "maxLength", "pattern", "format"),
    "array": (
        "items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains", "minContains", "maxContains",
        "unevaluatedItems",
    ),
    "object": (
        "properties", "patternProperties", "additionalProperties", "required", "minProperties", "maxProperties",
        "dependentRequired", "dependentSchemas", "dependencies", "propertyNames", "unevaluatedProperties",
    ),
}  # fmt: skip
#: Keywords that assert something about any instance.
GENERAL_KEYWORDS = (
    "type",
    "not",
    "if",
    "then",
    "else",
    "$dynamicRef",
    "$recursiveRef",
    *EXCLUSIVE_CONSTRUCTS,
)
#: Every keyword that can reject an instance.
ASSERTIONS = frozenset(GENERAL_KEYWORDS).union(*TYPE_KEYWORDS.values())
#: The values of the ``type`` keyword.
JSON_TYPES = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})

#: Keywords whose value is one subschema.
SCHEMA_VALUED = (
    "additionalProperties",
    "items",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
)
#: Keywords whose value maps names to subschemas.
SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")
#: Keywords whose value is a list of subschemas.
SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
#: Keywords whose value is a JSON value, never a schema (a "$ref" in there is data).
JSON_VALUED = ("enum", "const", "default", "examples", "example")

_OBJECT_HINTS = ("properties", "additionalProperties", "unevaluatedProperties")
_ARRAY_HINTS = ("items", "prefixItems", "unevaluatedItems")


def inferred_types(node: dict) -> set[str] | None:
    """The JSON types xgrammar lets through for a typed object (integer implies number); None: untyped."""
    declared = node.get("type")
    if isinstance(declared, str):
        declared = [declared]
    if isinstance(declared, list) and declared:
        return {t for t in declared if t in JSON_TYPES}
    if any(k in node for k in _OBJECT_HINTS):
        return {"object"}
    if any(k in node for k in _ARRAY_HINTS):
        return {"array"}
    return None


def listed_types(node: dict) -> list[str]:
    """The ``type`` keyword as a list, as written ([] when there is none)."""
    declared = node.get("type")
    return [declared] if isinstance(declared, str) else list(declared) if isinstance(declared, list) else []


def assertions_of(node) -> dict:
    """The keywords of a schema object that can reject an instance ({} for a boolean schema)."""
    return {k: v for k, v in node.items() if k in ASSERTIONS} if isinstance(node, dict) else {}


def listed_names(value) -> list[str]:
    """The strings in a list such as ``required`` ([] when it is not a list)."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def is_number(value) -> bool:
    """A JSON number (a bool is not one, although Python counts it as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_whole(value) -> bool:
    """A positive whole number, as a ``multipleOf`` that integers can meet."""
    return is_number(value) and float(value).is_integer() and value > 0


def is_count(value) -> bool:
    """A whole number >= 0, as a length limit."""
    return is_number(value) and float(value).is_integer() and value >= 0


def json_equal(x, y) -> bool:
    """Equality of JSON values as JSON Schema defines it: 1 == 1.0, but true != 1."""
    if isinstance(x, bool) or isinstance(y, bool):
        return type(x) is type(y) and x == y
    if is_number(x) and is_number(y):
        return x == y
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(json_equal(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(json_equal(u, v) for u, v in zip(x, y))
    return type(x) is type(y) and x == y
