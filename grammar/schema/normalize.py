r"""normalize_schema(): an equivalent JSON schema that xgrammar 0.2.8 enforces more of.

xgrammar reads one construct per schema object and ignores the assertions next to it (support.py
has the details), so ``{"required": ["b"], "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}`` loses
its ``required``. normalize_schema() moves assertions to where xgrammar reads them, and only where the
rewrite is exact: JSON Schema accepts the same instances. The transformations, in order:

 1. A local ``$ref`` that points anywhere but ``#``, ``#/$defs/<name>`` or ``#/definitions/<name>`` is
    re-pointed at a copy of its target in ``$defs`` (the rewrites below may move what it pointed at).
 2. The dialect becomes 2020-12: ``items: [...]`` becomes ``prefixItems`` (``additionalItems`` becomes
    ``items``); boolean ``exclusiveMinimum``/``exclusiveMaximum`` (draft 4) become numbers;
    ``dependencies`` becomes ``dependentRequired``/``dependentSchemas``; the assertions next to a ``$ref``,
    which drafts 3-7 ignore, are dropped; ``$schema`` names 2020-12. Unknown keywords, which mean
    nothing, are dropped (xgrammar closes an object schema that carries one). One difference remains:
    draft 4 does not count ``1.0`` as an integer, 2020-12 does (xgrammar never writes ``1.0`` for one).

Then bottom-up, on every subschema:

 3. ``enum``/``const`` next to other assertions keep only the values those accept (judged by
    jsonschema) and replace them (not when no value is left).
 4. ``allOf`` branches are merged into the enclosing schema one by one where the merge is exact (rules in
    SchemaMerger.merge); the others stay in ``allOf``.
 5. A ``$ref`` next to assertions (2019-09 on) loses those its target implies; otherwise the target is
    inlined and merged. Recursive schemas stay finite: not inlined are a target that refers to itself
    next to assertions, a target already being inlined three levels deep, and any target when the
    document's $refs loop in place (``{"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}}``; such a
    document also skips steps 3 and 9, jsonschema cannot evaluate it).
 6. ``not: {type: T}`` becomes the complementary ``type``.
 7. A schema without ``type`` whose keywords xgrammar would ignore for lack of one (minLength, minimum,
    required, ...) becomes an ``anyOf`` with one typed branch per type.
 8. The assertions next to ``anyOf``/``oneOf`` are merged into every branch; branches that then accept
    nothing are dropped, an ``anyOf`` branch that is only an ``anyOf`` is flattened, a single branch
    replaces the list, an ``anyOf`` with a branch that accepts everything disappears.
 9. A ``oneOf`` whose branches are provably disjoint becomes ``anyOf`` (xgrammar's own proof is weaker;
    where it fails it warns "falling back to anyOf semantics").
10. Assertions every instance meets (``required: []``, ``minLength``/``minItems``/``minProperties`` 0,
    ``uniqueItems: false``) are dropped: xgrammar closes objects and arrays that carry them.
11. ``patternProperties`` keys are anchored (15); a declared property whose name matches one of them gets
    its schema merged in (JSON Schema applies both; xgrammar applies either one).
12. ``number`` with a whole ``multipleOf`` becomes ``integer``; on integers ``multipleOf: p/q`` becomes
    ``p`` (and goes when p is 1); bounds of integers that are not whole are rounded inwards (xgrammar
    refuses them).
13. Strings: a ``format`` xgrammar knows is dropped where it would hide ``pattern``/``minLength``/
    ``maxLength`` (jsonschema treats ``format`` as an annotation). ``minLength``/``maxLength`` that the
    pattern implies are dropped; ``^Xq$`` (X one character, q a quantifier) absorbs them as
    ``^X{m,n}$``; an unanchored pattern of fixed width n with ``maxLength`` n becomes ``^P$``. Lengths
    with no pattern become the pattern ``^[^"\\\x00-\x1f]{m,n}$``: xgrammar's own length rule lets raw
    control characters into the string (invalid JSON) and already allows no escapes, so this only
    takes the control characters away.
14. A one-element ``type`` list becomes a string.
15. A pattern not anchored at both ends gets ``[\s\S]*`` on the open side (JSON Schema searches, xgrammar
    matches the whole string).

Steps 3-15 repeat until nothing changes (a later round sees normalized ``$ref`` targets), then again
with these two (they would get in the way of the merges above), until nothing changes:

16. Arrays and objects that declare no members get JSON Schema's defaults written out (``items: {}``,
    ``additionalProperties: {}``): xgrammar's strict mode otherwise lets only ``[]``/``{}`` through as
    soon as the schema has any other keyword (and cannot compile minItems/minProperties at all).
17. ``required`` names missing from ``properties`` are declared after the declared ones, with the schema
    that governs them (matching ``patternProperties``, else ``additionalProperties``, else ``{}``):
    xgrammar ignores undeclared required names, and its strict mode forbids them.

Where the steps live: 1-2 in upgrade.py; 3-15 in simplify.py, with the merge rules in
merge.py and the rewrites of one object on its own in tidy.py; 16-17 here (finish).
"""

from __future__ import annotations

import copy

from .keywords import (
    ANNOTATIONS,
    ASSERTIONS,
    EXCLUSIVE_CONSTRUCTS,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SCHEMA_VALUED,
    inferred_types,
    listed_names,
)
from .patterns import anchor_pattern, compile_key_patterns, fold_lengths
from .refs import has_ref_loop, is_local_ref, resolve_ref
from .simplify import SchemaSimplifier
from .tidy import open_containers
from .upgrade import upgrade_dialect

__all__ = ["anchor_pattern", "compile_key_patterns", "fold_lengths", "normalize_schema"]

_NOT_INLINED = ("$defs", "definitions", "$schema", "$anchor", "$dynamicAnchor")  # kept out of inlined targets


def normalize_schema(schema: dict) -> dict:
    """An equivalent schema (2020-12 dialect) whose assertions sit where xgrammar enforces them.

    Pure: the input is not modified. Idempotent: normalizing the result again returns it unchanged.
    """
    if not isinstance(schema, dict):
        raise ValueError(f"schema must be a JSON object (dict), got {type(schema).__name__}")
    doc = upgrade_dialect(schema)  # steps 1-2
    for finishing in (False, True):  # steps 3-15 to a fixed point, then with 16-17 to one
        for _ in range(3):  # a later round sees normalized $ref targets (more provably disjoint oneOfs)
            normalizer = _Normalizer(doc)
            normalized = normalizer.normalize(doc)
            normalized = normalizer.finish(normalized) if finishing else normalized
            if normalized == doc:
                break
            doc = normalized
    return copy.deepcopy(doc)


class _Normalizer(SchemaSimplifier):
    """Normalizes the subschemas of one document, whose $refs resolve in ``root`` (the upgraded input)."""

    def __init__(self, root: dict) -> None:
        # jsonschema judges values (steps 3, 9) and $refs are inlined (4, 5) unless $refs loop in place
        super().__init__(None if has_ref_loop(root) else root)
        self.root = root
        self.targets: dict[str, object] = {}  # normalized $ref targets (None: not usable)

    def normalize(self, node):
        """Normalizes every subschema of node, then node itself."""
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key not in ASSERTIONS and key not in ANNOTATIONS:
                continue  # step 2: unknown keywords mean nothing, yet xgrammar closes objects that carry them
            if key in SCHEMA_VALUED:
                value = self.normalize(value)
            elif key in SCHEMA_MAPS and isinstance(value, dict):
                value = {name: self.normalize(child) for name, child in value.items()}
            elif key in SCHEMA_LISTS and isinstance(value, list):
                value = [self.normalize(child) for child in value]
            out[key] = value
        return self.simplify(out)

    def target(self, ref):
        """The normalized target of a local $ref without its definitions; None when it does not resolve,
        changes the base URI, or is being normalized (a reference to itself)."""
        if self.proof_root is None:  # $refs that loop in place: inlining them would never end
            return None
        if ref not in self.targets:
            self.targets[ref] = None  # until normalized: references inside it to itself are left alone
            node = resolve_ref(self.root, ref) if isinstance(ref, str) and is_local_ref(ref) else None
            if node is True:
                node = {}
            if node is False:
                self.targets[ref] = False
            elif isinstance(node, dict) and not isinstance(node.get("$id", node.get("id")), str):
                self.targets[ref] = {k: v for k, v in self.normalize(node).items() if k not in _NOT_INLINED}
        return self.targets[ref]

    def finish(self, node):
        """Steps 16 and 17 on every subschema of a normalized document."""
        if not isinstance(node, dict):
            return node
        out = {key: self._finish_child(key, value) for key, value in node.items()}
        if any(k in out for k in EXCLUSIVE_CONSTRUCTS):  # elsewhere xgrammar reads none of this
            return out
        out = open_containers(out)
        properties, required = out.get("properties", {}), listed_names(out.get("required"))
        patterns = compile_key_patterns(out.get("patternProperties"))
        missing = [r for r in required if isinstance(properties, dict) and r not in properties]
        if not missing or "object" not in (inferred_types(out) or ()) or patterns is None:
            return out
        additional = out.get("additionalProperties", True)
        declared = dict(properties)
        for name in missing:
            governing = [s for regex, s in patterns if regex.search(name)]
            if not governing and additional is not False:
                governing = [{} if additional is True else additional]
            merged = self.merge_all({}, governing) if governing else None
            if merged is not None and merged is not False:  # else required yet forbidden: left as it is
                declared[name] = merged
        return {**out, "properties": declared}

    def _finish_child(self, key: str, value):
        if key in SCHEMA_VALUED:
            return self.finish(value)
        if key in SCHEMA_MAPS and isinstance(value, dict):
            return {name: self.finish(child) for name, child in value.items()}
        if key in SCHEMA_LISTS and isinstance(value, list):
            return [self.finish(child) for child in value]
        return value
