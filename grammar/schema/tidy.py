r"""Rewrites of one schema object on its own: no other subschema, no merge and no $ref is involved.

Steps 10, 11 (anchoring the keys), 12, 13, 15 and 16 of normalize_schema(); the step numbers are those
of the list in normalize.py. Each function takes a schema object and returns an equivalent one
(the same object when there is nothing to do), never modifying its argument.
"""

from __future__ import annotations

import math
from fractions import Fraction

from .keywords import FORMATS_XGRAMMAR, is_count, is_number, is_whole, listed_types
from .patterns import anchor_pattern, fold_lengths

_HIDDEN_BY_FORMAT = ("pattern", "minLength", "maxLength")  # what xgrammar ignores next to a format
_PLAIN_JSON_CHAR = r'[^"\\\x00-\x1f]'  # a string character that needs no escape


def drop_no_ops(node: dict) -> dict:
    """Step 10: assertions every instance satisfies; xgrammar closes objects and arrays that carry them."""
    no_op = [
        k
        for k, v in node.items()
        if (k == "required" and v == [])
        or (k in ("minLength", "minItems", "minProperties") and v == 0 and not isinstance(v, bool))
        or (k == "uniqueItems" and v is False)
    ]
    return {k: v for k, v in node.items() if k not in no_op} if no_op else node


def anchor_pattern_properties(node: dict) -> dict:
    """Step 11, first half: patternProperties keys anchored as step 15 anchors a pattern."""
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict) and any(anchor_pattern(p) != p for p in patterns):
        node = {**node, "patternProperties": {anchor_pattern(p): s for p, s in patterns.items()}}
    return node


def fix_numbers(node: dict) -> dict:
    """Step 12: a whole multipleOf makes numbers integers; on integers multipleOf p/q means p, and
    bounds that are not whole are rounded inwards."""
    types, step = listed_types(node), node.get("multipleOf")
    if "number" in types and is_whole(step):
        types = list(dict.fromkeys("integer" if t == "number" else t for t in types))
        node = {**node, "type": types[0] if len(types) == 1 else types}
    if "integer" not in types or "number" in types:
        return node
    out = dict(node)
    if is_number(step) and step > 0:  # integer multiples of p/q (lowest terms) are the multiples of p
        numerator = Fraction(repr(step)).numerator
        if numerator == 1:
            del out["multipleOf"]
        else:
            out["multipleOf"] = numerator
    for key, rounded in (("minimum", math.ceil), ("maximum", math.floor)):
        if isinstance(out.get(key), float):
            out[key] = rounded(out[key])
    for key, limit, inner, tighter in (
        ("exclusiveMinimum", "minimum", lambda v: math.floor(v) + 1, max),
        ("exclusiveMaximum", "maximum", lambda v: math.ceil(v) - 1, min),
    ):
        value = out.get(key)
        if isinstance(value, float) and value.is_integer():
            out[key] = int(value)
        elif isinstance(value, float):
            del out[key]
            current = out.get(limit)
            out[limit] = inner(value) if not is_number(current) else tighter(inner(value), current)
    return out


def fix_string(node: dict) -> dict:
    """Steps 13 and 15: format, lengths and pattern arranged so that xgrammar enforces all three."""
    is_string = "string" in listed_types(node)
    if is_string and node.get("format") in FORMATS_XGRAMMAR and any(k in node for k in _HIDDEN_BY_FORMAT):
        node = {k: v for k, v in node.items() if k != "format"}
    pattern = node.get("pattern")
    if pattern is None and is_string and ("minLength" in node or "maxLength" in node):
        return _lengths_as_pattern(node)
    if not isinstance(pattern, str):
        return node
    if is_string and ("minLength" in node or "maxLength" in node):
        folded = fold_lengths(pattern, node.get("minLength", 0), node.get("maxLength"))
        if folded is not None:
            return {
                **{k: v for k, v in node.items() if k not in ("minLength", "maxLength")},
                "pattern": folded,
            }
    anchored = anchor_pattern(pattern)
    return node if anchored == pattern else {**node, "pattern": anchored}


def open_containers(node: dict) -> dict:
    """Step 16: JSON Schema's defaults written out where a container declares no members: xgrammar's
    strict mode otherwise lets only [] or {} through once the schema has any other keyword
    (minItems/minProperties do not even compile)."""
    types = listed_types(node)
    if "array" in types and not any(k in node for k in ("items", "prefixItems", "unevaluatedItems")):
        node = {**node, "items": {}}
    members = ("properties", "patternProperties", "additionalProperties", "unevaluatedProperties")
    if "object" in types and not any(k in node for k in members):
        node = {**node, "additionalProperties": {}}
    return node


def _lengths_as_pattern(node: dict) -> dict:
    """Lengths without a pattern as the pattern of as many characters that need no JSON escape."""
    low, high = node.get("minLength", 0), node.get("maxLength")
    if not is_count(low) or not (high is None or is_count(high)) or (high is not None and low > high):
        return node
    rest = {k: v for k, v in node.items() if k not in ("minLength", "maxLength")}
    return {**rest, "pattern": f"^{_PLAIN_JSON_CHAR}{{{int(low)},{'' if high is None else int(high)}}}$"}
