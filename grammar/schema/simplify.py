"""SchemaSimplifier.simplify(): steps 3-15 of normalize_schema() on one schema object.

The object's subschemas are already normalized; simplify() moves its assertions to where xgrammar reads
them, by merging (merge.py) and by local rewrites (tidy.py), and repeats until nothing
changes. The step numbers are those of the list in normalize.py.
"""

from __future__ import annotations

from jsonschema import Draft202012Validator
from referencing import Registry

from .disjoint import excludes
from .keywords import (
    ASSERTIONS,
    EXCLUSIVE_CONSTRUCTS,
    TYPE_KEYWORDS,
    assertions_of,
    inferred_types,
    listed_types,
)
from .merge import SchemaMerger
from .patterns import compile_key_patterns, quiet_regex_warnings
from .tidy import anchor_pattern_properties, drop_no_ops, fix_numbers, fix_string

_CONTAINER_DEFAULTS = ("items", "additionalProperties")
_ALL_TYPES = ("null", "boolean", "object", "array", "number", "string")


class SchemaSimplifier(SchemaMerger):
    """Simplifies schema objects of a document whose $refs resolve in ``proof_root``; None when they loop
    in place (has_ref_loop): then jsonschema cannot judge values (steps 3, 9) and no $ref is inlined.
    A subclass supplies target() (SchemaMerger)."""

    def __init__(self, proof_root: dict | None) -> None:
        super().__init__()
        self.proof_root = proof_root
        self.validator = None if proof_root is None else Draft202012Validator(proof_root, registry=Registry())

    def simplify(self, node):
        """Steps 3-15 on one schema object whose subschemas are already normalized."""
        for _ in range(4):  # a step can expose work for an earlier one; a few rounds reach the fixed point
            before = node
            node = self.merge_all_of(self.filter_values(node))
            if not isinstance(node, dict):
                return node
            node = self.split_by_type(self.complement_not_type(node))
            node = self.distribute(self.distribute(self.resolve_ref_siblings(node), "oneOf"), "anyOf")
            node = self.oneof_to_anyof(node)
            if node == before:
                break
        return self.tidy(node)

    def tidy(self, node: dict) -> dict:
        """Steps 10-15: local rewrites of one schema object."""
        node = self.merge_pattern_schemas(anchor_pattern_properties(drop_no_ops(node)))
        node = fix_string(fix_numbers(node))
        if isinstance(node.get("type"), list) and len(node["type"]) == 1:
            node = {**node, "type": node["type"][0]}
        return node

    def filter_values(self, node: dict) -> dict:
        """Step 3: enum/const keep the values the other assertions accept, and replace those assertions."""
        key = "const" if "const" in node else "enum" if isinstance(node.get("enum"), list) else None
        rest = {k: v for k, v in node.items() if k in ASSERTIONS and k != key}
        if key is None or not rest or self.validator is None:
            return node
        values = [node["const"]] if key == "const" else node["enum"]
        try:
            with quiet_regex_warnings():
                kept = [v for v in values if self.validator.evolve(schema=rest).is_valid(v)]
        except Exception:  # an unresolvable $ref or a malformed keyword: leave it to find_unsupported
            return node
        if not kept:
            return node
        out = {k: v for k, v in node.items() if k not in ASSERTIONS}
        out[key] = kept[0] if key == "const" else kept
        return out

    def merge_all_of(self, node: dict):
        """Step 4: merges allOf branches into node; those that do not merge exactly stay in allOf."""
        branches = node.get("allOf")
        if not isinstance(branches, list):
            return node
        own = {k: v for k, v in node.items() if k in ASSERTIONS and k != "allOf"}
        parts = [*branches, own] if _declared_before(node, "allOf") else [own, *branches]
        merged, left = {}, []
        for part in parts:
            candidate = self.merge(merged, part)
            if candidate is None or candidate is False:  # a merge that accepts nothing stays visible
                left.append(part)
            else:
                merged = candidate
        kept = {k: v for k, v in node.items() if k not in ASSERTIONS}  # $defs stay where $refs point
        merged = {**kept, **{k: v for k, v in merged.items() if k not in kept}}
        return {**merged, "allOf": left} if left else merged

    def resolve_ref_siblings(self, node: dict) -> dict:
        """Step 5: a $ref with sibling assertions becomes a plain $ref or the merged, inlined target."""
        siblings = {k: v for k, v in node.items() if k in ASSERTIONS and k != "$ref"}
        if not isinstance(node.get("$ref"), str) or not siblings:
            return node
        merged = self.merge_ref({"$ref": node["$ref"]}, siblings)
        if merged is None or merged is False:
            return node
        return {**{k: v for k, v in node.items() if k not in ASSERTIONS}, **merged}

    def complement_not_type(self, node: dict) -> dict:
        """Step 6: ``not: {type: T}`` is the type of everything but T."""
        negated = {
            k: v
            for k, v in assertions_of(node.get("not")).items()
            if not (k in _CONTAINER_DEFAULTS and (v == {} or v is True))
        }
        if set(negated) != {"type"}:
            return node
        excluded = set(listed_types(negated))
        if not excluded or ("integer" in excluded and "number" not in excluded):
            return node
        allowed = [t for t in _ALL_TYPES if t not in excluded]
        merged = (
            self.merge({k: v for k, v in node.items() if k != "not"}, {"type": allowed}) if allowed else None
        )
        return node if merged is None or merged is False else merged

    def split_by_type(self, node: dict) -> dict:
        """Step 7: an untyped schema with keywords of some types becomes one anyOf branch per type."""
        families = [t for t in TYPE_KEYWORDS if any(k in node and k != "format" for k in TYPE_KEYWORDS[t])]
        if not families or inferred_types(node) is not None or any(k in node for k in EXCLUSIVE_CONSTRUCTS):
            return node
        typed = {k for t in TYPE_KEYWORDS for k in TYPE_KEYWORDS[t]}
        shared = {k: v for k, v in node.items() if k in ASSERTIONS and k not in typed}
        branches = [
            {"type": t, **shared, **{k: node[k] for k in TYPE_KEYWORDS[t] if k in node}} for t in families
        ]
        others = [t for t in _ALL_TYPES if t not in families]
        if others:
            branches.append({"type": others, **shared})
        rest = {k: v for k, v in node.items() if k not in ASSERTIONS}
        return {**rest, "anyOf": [self.simplify(b) for b in branches]}

    def distribute(self, node: dict, key: str) -> dict:
        """Step 8: the assertions next to anyOf/oneOf go into every branch."""
        branches = node.get(key)
        if not isinstance(branches, list) or not branches:
            return node
        siblings = {k: v for k, v in node.items() if k in ASSERTIONS and k != key}
        if key == "anyOf" and any(
            b is True or (isinstance(b, dict) and not assertions_of(b)) for b in branches
        ):
            return {k: v for k, v in node.items() if k != key}  # one branch accepts everything
        kept = []
        for branch in branches:
            merged = (
                self.merge(branch, siblings) if _declared_before(node, key) else self.merge(siblings, branch)
            )
            if merged is None:
                return node
            if merged is False:
                continue
            if key == "anyOf" and set(assertions_of(merged)) == {"anyOf"}:
                kept.extend(merged["anyOf"])
            else:
                kept.append(merged)
        rest = {k: v for k, v in node.items() if k not in ASSERTIONS}
        if not kept:
            return node
        if len(kept) == 1:
            return {**rest, **kept[0]}
        return {**rest, key: kept}

    def oneof_to_anyof(self, node: dict) -> dict:
        """Step 9: oneOf over provably disjoint branches means anyOf."""
        branches = node.get("oneOf")
        if not isinstance(branches, list) or len(branches) < 2 or "anyOf" in node:
            return node
        for i, a in enumerate(branches):
            for b in branches[i + 1 :]:
                if not (excludes(a, b, self.proof_root) or excludes(b, a, self.proof_root)):
                    return node
        return {**{k: v for k, v in node.items() if k != "oneOf"}, "anyOf": branches}

    def merge_pattern_schemas(self, node: dict) -> dict:
        """Step 11: a declared property whose name matches patternProperties gets their schemas too."""
        properties = node.get("properties")
        patterns = compile_key_patterns(node.get("patternProperties"))
        if not isinstance(properties, dict) or not patterns:
            return node
        declared = dict(properties)
        for name in properties:
            merged = self.merge_all(properties[name], [s for regex, s in patterns if regex.search(name)])
            if merged is not None and merged is not False:
                declared[name] = merged
        return node if declared == properties else {**node, "properties": declared}


def _declared_before(node: dict, key: str) -> bool:
    """Whether key comes before "properties" in node: its branches' properties are declared first."""
    keys = list(node)
    return "properties" in node and keys.index(key) < keys.index("properties")
