"""SchemaMerger.merge(): one schema equivalent to ``allOf: [a, b]``, written only where it is exact.

Step 4 of normalize_schema() merges ``allOf`` branches with it, steps 5, 6, 8, 11 and 17 merge sibling
assertions into ``$ref`` targets and ``anyOf``/``oneOf`` branches (the step numbers are those of the list
in normalize.py). A merge that this module cannot write exactly answers None and the caller keeps
the schema as it was; one that no instance satisfies answers False.
"""

from __future__ import annotations

import math
from collections import Counter

from .keywords import ASSERTIONS, assertions_of, is_number, is_whole, json_equal, listed_names
from .refs import has_ref_with_siblings

_GROUPS = (  # keywords that constrain the same members, merged together
    ("properties", "patternProperties", "additionalProperties"),
    ("prefixItems", "items"),
    ("contains", "minContains", "maxContains"),
    ("if", "then", "else"),
)
_GROUPED = frozenset(k for group in _GROUPS for k in group)
_UNMERGEABLE = ("unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef")
_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_MAX_BRANCHES = 64
_MAX_REF_DEPTH = 3  # a $ref inlined inside its own inlining, at most this deep
_FAIL = object()  # a keyword merge this module cannot write exactly
_EMPTY = object()  # a keyword merge that no instance satisfies


class SchemaMerger:
    """Merges normalized schemas. A subclass supplies simplify() (steps 3-15 on one schema object whose
    subschemas are normalized, applied to every merge result) and target() (the normalized target of a
    local $ref, None when it cannot be inlined)."""

    def __init__(self) -> None:
        self.merging: Counter[str] = Counter()  # how deep each $ref's target is being merged

    def simplify(self, node):
        """Steps 3-15 on one schema object whose subschemas are already normalized."""
        raise NotImplementedError

    def target(self, ref):
        """The normalized target of a local $ref; None when it cannot be inlined, False if it is false."""
        raise NotImplementedError

    def merge(self, a, b):
        """A normalized schema equivalent to ``allOf: [a, b]``; False if nothing satisfies both; None
        when this module cannot write it exactly.

        Rules: ``type`` and ``enum``/``const`` intersected; ``required`` united; lower bounds raised and
        upper bounds lowered; integer ``multipleOf`` by least common multiple; ``properties`` per key, a key
        one side does not declare taking that side's ``additionalProperties``; ``prefixItems``/``items``
        per position; ``anyOf``x``anyOf`` and ``oneOf``x``oneOf`` as a cross product (at most 64
        branches); ``not``s joined as ``not: {anyOf: [...]}``; ``allOf``s concatenated;
        ``dependentRequired`` united, ``dependentSchemas``/``propertyNames`` merged; equal values kept;
        annotations from ``a``; a ``$ref`` inlined as in step 5. Not merged: different ``pattern``,
        ``format``, ``contains`` or ``if``; ``patternProperties`` next to other property keywords;
        ``unevaluated*``.
        """
        a, b = ({} if a is True else a), ({} if b is True else b)
        if a is False or b is False:
            return False
        if not isinstance(a, dict) or not isinstance(b, dict):
            return None
        if not assertions_of(b) or a == b:
            return {**b, **a}
        if not assertions_of(a):
            return {**a, **b}
        if "$ref" in a or "$ref" in b:
            return self.merge_ref(a, b)
        if any(k in a or k in b for k in _UNMERGEABLE):
            return None
        groups = {}
        for group in _GROUPS:
            groups[group[0]] = merged = self._merge_group(group, a, b)
            if merged is None or merged is False:
                return merged
        out: dict = {}
        for key in [*a, *(k for k in b if k not in a)]:  # declared order: properties keep theirs
            if key in _GROUPED:
                out.update(groups[next(g[0] for g in _GROUPS if key in g)])
                continue
            value = (
                self._merge_keyword(key, a[key], b[key]) if key in a and key in b else a.get(key, b.get(key))
            )
            if value is _FAIL:
                return None
            if value is _EMPTY:
                return False
            out[key] = value
        return self.simplify(out)

    def merge_all(self, first, others: list):
        """first merged with each of others in turn; stops at the first None or False."""
        merged = first
        for schema in others:
            if merged is None or merged is False:
                return merged
            merged = self.merge(merged, schema)
        return merged

    def merge_ref(self, a: dict, b: dict):
        """Step 5: a merge where a or b holds a $ref: the plain $ref when its target implies the rest,
        else the target inlined and merged."""
        ref_node, other = (a, b) if "$ref" in a else (b, a)
        ref = ref_node["$ref"]
        target = self.target(ref)
        if target is None or target is False:
            return target
        if self.merging[ref] >= _MAX_REF_DEPTH:  # merging two recursive schemas: the result never ends
            return None
        extra = self.merge({k: v for k, v in ref_node.items() if k != "$ref"}, other)
        if extra is None or extra is False:
            return extra
        self.merging[ref] += 1
        try:
            merged = self.merge(target, extra)
        finally:
            self.merging[ref] -= 1
        if isinstance(merged, dict) and assertions_of(merged) == assertions_of(
            target
        ):  # target implies extra
            keep = {k: v for k, v in {**extra, **ref_node}.items() if k not in ASSERTIONS}
            return {**keep, "$ref": ref}
        # A target that refers to itself next to assertions (left alone while it was normalized) would
        # bring that reference here, to be inlined again next round: such a target stays a $ref.
        return None if has_ref_with_siblings(target) else merged

    def _merge_group(self, group: tuple[str, ...], a: dict, b: dict):
        in_a = {k: a[k] for k in group if k in a}
        in_b = {k: b[k] for k in group if k in b}
        if not in_a or not in_b or in_a == in_b:
            return in_a or in_b
        if group[0] == "properties":
            return self._merge_objects(a, b)
        if group[0] == "prefixItems":
            return self._merge_arrays(a, b)
        return None

    def _merge_objects(self, a: dict, b: dict):
        props_a, props_b = a.get("properties", {}), b.get("properties", {})
        if (
            "patternProperties" in a
            or "patternProperties" in b
            or not isinstance(props_a, dict)
            or not isinstance(props_b, dict)
        ):
            return None
        extra_a, extra_b = a.get("additionalProperties", True), b.get("additionalProperties", True)
        required = set(listed_names(a.get("required"))) | set(listed_names(b.get("required")))
        additional = self.merge(extra_a, extra_b)
        if additional is None:
            return None
        properties = {}
        for key in [*props_a, *(k for k in props_b if k not in props_a)]:
            merged = self.merge(props_a.get(key, extra_a), props_b.get(key, extra_b))
            if merged is None or (merged is False and additional is not False and key not in required):
                return None
            if merged is False and key in required:
                return False
            if merged is not False:  # a False one is left out: additionalProperties false forbids it
                properties[key] = merged
        out: dict = {"properties": properties} if "properties" in a or "properties" in b else {}
        if "additionalProperties" in a or "additionalProperties" in b:
            out["additionalProperties"] = additional
        return out

    def _merge_arrays(self, a: dict, b: dict):
        prefix_a, prefix_b = a.get("prefixItems", []), b.get("prefixItems", [])
        items_a, items_b = a.get("items", True), b.get("items", True)
        prefix = []
        for i in range(max(len(prefix_a), len(prefix_b))):
            merged = self.merge(
                prefix_a[i] if i < len(prefix_a) else items_a, prefix_b[i] if i < len(prefix_b) else items_b
            )
            if merged is None or merged is False:
                return None
            prefix.append(merged)
        out: dict = {"prefixItems": prefix} if prefix else {}
        if "items" in a or "items" in b:
            out["items"] = self.merge(items_a, items_b)
            if out["items"] is None:
                return None
        return out

    def _merge_keyword(self, key: str, x, y):
        if json_equal(x, y):
            return x
        if key not in ASSERTIONS:
            return x  # annotations and unknown keywords assert nothing: keep a's
        if key == "type":
            return _intersect_types(x, y)
        if key == "enum" and isinstance(x, list) and isinstance(y, list):
            kept = [v for v in x if any(json_equal(v, w) for w in y)]
            return kept if kept else _EMPTY
        if key == "const":
            return _EMPTY
        if key == "required" and isinstance(x, list) and isinstance(y, list):
            return x + [r for r in y if r not in x]
        if key in _LOWER_BOUNDS + _UPPER_BOUNDS and is_number(x) and is_number(y):
            return max(x, y) if key in _LOWER_BOUNDS else min(x, y)
        if key == "multipleOf" and is_whole(x) and is_whole(y):
            return math.lcm(int(x), int(y))
        if key == "uniqueItems" and isinstance(x, bool) and isinstance(y, bool):
            return x or y
        if key == "not":
            return {"anyOf": [x, y]}
        if key == "allOf" and isinstance(x, list) and isinstance(y, list):
            return x + y
        if key in ("anyOf", "oneOf") and isinstance(x, list) and isinstance(y, list):
            return self._cross(x, y)
        if key == "dependentRequired" and isinstance(x, dict) and isinstance(y, dict):
            return {**x, **{k: x.get(k, []) + [n for n in v if n not in x.get(k, [])] for k, v in y.items()}}
        if key == "dependentSchemas" and isinstance(x, dict) and isinstance(y, dict):
            merged = {
                k: self.merge(x[k], y[k]) if k in x and k in y else x.get(k, y.get(k)) for k in {**x, **y}
            }
            return _FAIL if any(v is None for v in merged.values()) else merged
        if key == "propertyNames":
            merged = self.merge(x, y)
            return _FAIL if merged is None else merged
        return _FAIL

    def _cross(self, x: list, y: list):
        """Branches of anyOf x AND anyOf y (also right for oneOf x AND oneOf y: one pair holds exactly)."""
        if len(x) * len(y) > _MAX_BRANCHES:
            return _FAIL
        pairs = [self.merge(p, q) for p in x for q in y]
        if any(m is None for m in pairs):
            return _FAIL
        pairs = [m for m in pairs if m is not False]
        return pairs if pairs else _EMPTY


def _intersect_types(x, y):
    """The types both ``type`` values allow (integer within number)."""
    tx = [x] if isinstance(x, str) else x
    ty = [y] if isinstance(y, str) else y
    if not isinstance(tx, list) or not isinstance(ty, list):
        return _FAIL
    both = [t for t in tx if t in ty or (t == "integer" and "number" in ty)]
    both += [t for t in ty if t == "integer" and "number" in tx and t not in both]
    if not both:
        return _EMPTY
    return both[0] if len(both) == 1 else both
