"""excludes(): a proof that two schemas share no instance, so that ``oneOf`` may be read as ``anyOf``.

xgrammar enforces ``oneOf`` only as ``anyOf``: it accepts an instance that matches several branches.
Where the branches are disjoint the two mean the same, and this module tries to prove that they are:
by values (``const``/``enum`` judged by jsonschema), by types, by numeric ranges, and by an object key
that one side requires and the other forbids or constrains incompatibly. The proof is sufficient, not
complete: False means "not proven", never "they overlap".
"""

from __future__ import annotations

import math

from jsonschema import Draft202012Validator
from referencing import Registry

from .keywords import JSON_TYPES, inferred_types, is_number
from .patterns import quiet_regex_warnings, search_pattern
from .refs import is_local_ref, resolve_ref

_MAX_DEPTH = 12  # nested subschemas compared before giving up (recursive schemas)
_MAX_DEREF = 16  # $refs followed in a row before giving up


def oneof_is_exclusive(branches: list, root) -> bool:
    """True when no output xgrammar lets through for one branch is valid under another branch."""
    return all(
        excludes(a, b, root, closed=True) and excludes(b, a, root, closed=True)
        for i, a in enumerate(branches)
        for b in branches[i + 1 :]
    )


def excludes(a, b, root, *, closed: bool = False, depth: int = 0) -> bool:
    """True if no instance that ``a`` accepts is valid under ``b`` (a sufficient test, not a complete one).

    "Accepts" means valid under JSON Schema, or with closed=True what xgrammar lets through: it reads one
    construct per object (EXCLUSIVE_CONSTRUCTS) and, in strict mode, an object that declares
    ``properties`` and no ``additionalProperties``/``patternProperties`` holds no other keys.
    """
    if depth > _MAX_DEPTH:
        return False
    a, b = _deref(a, root), _deref(b, root)
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    deeper = {"root": root, "closed": closed, "depth": depth + 1}
    if _values(a) is not None:
        return not any(_is_valid(v, b, root) for v in _values(a))
    if _values(b) is not None:
        return not any(_is_valid(v, a, root) for v in _values(b))
    for key in ("anyOf", "oneOf"):
        if isinstance(a.get(key), list):
            return all(excludes(x, b, **deeper) for x in a[key])
    for key in ("anyOf", "oneOf"):
        if isinstance(b.get(key), list):
            return all(excludes(a, y, **deeper) for y in b[key])
    if isinstance(a.get("allOf"), list) and any(excludes(x, b, **deeper) for x in a["allOf"]):
        return True
    if isinstance(b.get("allOf"), list) and any(excludes(a, y, **deeper) for y in b["allOf"]):
        return True
    shared = _shared_types(inferred_types(a) if closed else _declared_types(a), _declared_types(b))
    if not shared:
        return True
    if shared <= {"integer", "number"}:
        return _ranges_disjoint(a, b)
    if shared == {"object"}:
        return _objects_exclude(a, b, deeper)
    return False


def _deref(node, root, limit: int = _MAX_DEREF):
    """Follows local $refs: what a $ref object accepts is within what its target accepts."""
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and limit > 0:
        target = resolve_ref(root, node["$ref"]) if is_local_ref(node["$ref"]) else None
        if target is None:
            return True
        node, limit = target, limit - 1
    return node


def _values(node: dict) -> list | None:
    if "const" in node:
        return [node["const"]]
    return node["enum"] if isinstance(node.get("enum"), list) else None


def _is_valid(value, schema, root) -> bool:
    """jsonschema's verdict on value under a subschema of root; True (cannot exclude) when it cannot tell."""
    try:
        validator = Draft202012Validator(root if isinstance(root, dict) else {}, registry=Registry())
        with quiet_regex_warnings():
            return validator.evolve(schema=schema).is_valid(value)
    except Exception:  # an unresolvable $ref or a malformed keyword: no proof either way
        return True


def _declared_types(node: dict) -> set[str] | None:
    declared = node.get("type")
    if isinstance(declared, str):
        declared = [declared]
    return {t for t in declared if t in JSON_TYPES} if isinstance(declared, list) and declared else None


def _shared_types(ta: set[str] | None, tb: set[str] | None) -> set[str]:
    if ta is None or tb is None:
        return set(JSON_TYPES if ta is None and tb is None else ta if tb is None else tb)
    shared = ta & tb
    if ("integer" in ta and "number" in tb) or ("number" in ta and "integer" in tb):
        shared.add("integer")
    return shared


def _ranges_disjoint(a: dict, b: dict) -> bool:
    (lo_a, lo_a_open), (hi_a, hi_a_open) = _bounds(a)
    (lo_b, lo_b_open), (hi_b, hi_b_open) = _bounds(b)
    return _below(hi_a, hi_a_open, lo_b, lo_b_open) or _below(hi_b, hi_b_open, lo_a, lo_a_open)


def _bounds(node: dict) -> tuple[tuple[float, bool], tuple[float, bool]]:
    """((lowest, is_open), (highest, is_open)) allowed by the numeric bounds of node."""
    lo, hi = (-math.inf, False), (math.inf, False)
    for key, is_open in (("minimum", False), ("exclusiveMinimum", True)):
        v = node.get(key)
        if is_number(v) and (v, is_open) > lo:
            lo = (v, is_open)
    for key, is_open in (("maximum", False), ("exclusiveMaximum", True)):
        v = node.get(key)
        if is_number(v) and (v, not is_open) < (hi[0], not hi[1]):
            hi = (v, is_open)
    return lo, hi


def _below(hi: float, hi_open: bool, lo: float, lo_open: bool) -> bool:
    return hi < lo or (hi == lo and (hi_open or lo_open))


def _objects_exclude(a: dict, b: dict, deeper: dict) -> bool:
    """Objects only: a key that one side requires and the other cannot hold, or whose values disagree."""
    required_a = [k for k in a.get("required", []) if isinstance(k, str)]
    required_b = [k for k in b.get("required", []) if isinstance(k, str)]
    for key in dict.fromkeys(required_a + required_b):
        in_a, in_b = _property_schema(a, key, deeper["closed"]), _property_schema(b, key, False)
        if (in_a is False and key in required_b) or (in_b is False and key in required_a):
            return True
        if in_a is not False and in_b is not False and excludes(in_a, in_b, **deeper):
            return True
    return False


def _property_schema(node: dict, key: str, closed: bool):
    """What a value at ``key`` must match in an object that ``node`` accepts; False: the key cannot appear."""
    properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    if key in properties:
        return properties[key]
    patterns = node.get("patternProperties") if isinstance(node.get("patternProperties"), dict) else {}
    matches = [search_pattern(p, key) for p in patterns]
    if None in matches or matches.count(True) > 1:
        return True
    if True in matches:
        return list(patterns.values())[matches.index(True)]
    if "additionalProperties" in node:
        return node["additionalProperties"]
    # strict mode: an object that declares properties holds no others
    return not (closed and "properties" in node and not patterns and "unevaluatedProperties" not in node)
