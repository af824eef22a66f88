"""Which JSON Schema keywords xgrammar 0.2.8 compiles but does not enforce; find_unsupported() lists them.

Measured with ``xgr.Grammar.from_json_schema(text, strict_mode=True)`` and
``xgrammar.testing._is_grammar_accept_string``: for every keyword below there is an instance that
xgrammar accepts and jsonschema rejects (tests/grammar/test_schema_support.py holds each one).

How xgrammar reads one schema object: it takes the first of ``$ref``, ``const``, ``enum``, ``anyOf``,
``oneOf``, ``allOf`` (in that order) and ignores every other assertion next to it. Without any of them it
goes by ``type``; a missing type is inferred as object from properties/additionalProperties/
unevaluatedProperties and as array from items/prefixItems/unevaluatedItems, and with neither every
string, number, array and object keyword is ignored. Within a type it does not enforce:

- integer: ``multipleOf`` next to any bound, or one that is not a whole number (1/q is harmless);
- number: ``multipleOf``;
- string: ``pattern``, ``minLength``, ``maxLength`` next to a ``format`` it knows (FORMATS_XGRAMMAR);
  ``minLength``/``maxLength`` next to ``pattern``; lookaround in a pattern (it is dropped);
- array: ``uniqueItems``, ``contains`` (with ``minContains``/``maxContains``);
- object: ``dependentRequired``, ``dependentSchemas``, ``dependencies``, ``required`` names that are not
  declared in ``properties``.

Nowhere: ``not``, ``if``/``then``/``else``, ``$dynamicRef``, ``$recursiveRef``, a ``$ref`` that is not a
local JSON pointer (``#`` or ``#/...``; others match anything), ``allOf`` with several branches, and the
exclusivity of ``oneOf`` unless it can prove the branches disjoint (it warns "falling back to anyOf
semantics" on stderr; that is a C++ log line, not a Python warning).

Stricter than JSON Schema, hence not reported: strict mode closes objects that declare properties, whole-
string matching of ``pattern``/``patternProperties``, formats checked although jsonschema treats them as
annotations, lengths counted on the JSON text (escapes, UTF-8 bytes), numbers without exponents.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from .disjoint import oneof_is_exclusive
from .keywords import (
    ASSERTIONS,
    EXCLUSIVE_CONSTRUCTS,
    FORMATS_XGRAMMAR,
    TYPE_KEYWORDS,
    inferred_types,
    is_number,
)
from .patterns import quiet_regex_warnings, search_pattern
from .refs import has_ref_loop, is_local_ref, resolve_ref

__all__ = ["UnsupportedKeyword", "find_unsupported", "has_ref_loop", "quiet_regex_warnings"]

#: Keywords xgrammar enforces nowhere, and what it does with them instead.
_NEVER_ENFORCED = {
    "not": "xgrammar ignores 'not'",
    "if": "xgrammar ignores 'if'/'then'/'else'",
    "$dynamicRef": "xgrammar does not resolve '$dynamicRef' (matches any value)",
    "$recursiveRef": "xgrammar does not resolve '$recursiveRef' (matches any value)",
    "dependentRequired": "xgrammar ignores 'dependentRequired'",
    "dependentSchemas": "xgrammar ignores 'dependentSchemas'",
    "dependencies": "xgrammar ignores 'dependencies'",
}
_LOOKAROUND = re.compile(r"\(\?<?[=!]")  # a lookahead or lookbehind, which xgrammar drops


@dataclass(frozen=True, slots=True)
class UnsupportedKeyword:
    """A keyword in the schema that xgrammar compiles but does not enforce."""

    path: str  #: JSON pointer of the schema object holding the keyword ("" is the root)
    keyword: str
    reason: str


def find_unsupported(schema: dict) -> list[UnsupportedKeyword]:
    """Keywords of ``schema`` (normally the output of normalize_schema) that xgrammar will not enforce.

    Follows local ``$ref``s instead of scanning ``$defs``, so unused definitions are not reported.
    """
    found: list[UnsupportedKeyword] = []
    _Walker(schema, found).walk(schema, "")
    return found


class _Walker:
    def __init__(self, root, found: list[UnsupportedKeyword]) -> None:
        self.root = root
        self.proof_root = None if has_ref_loop(root) else root  # $refs for proofs (none if they loop)
        self.found = found
        self.visited_refs: set[str] = {"#"}

    def report(self, path: str, keyword: str, reason: str) -> None:
        self.found.append(UnsupportedKeyword(path, keyword, reason))

    def walk(self, node, path: str) -> None:
        if not isinstance(node, dict):
            return
        ignored = self.check_object(node, path)
        for child, child_path in subschemas(node, path, skip=ignored):
            self.walk(child, child_path)
        ref = node.get("$ref")
        if isinstance(ref, str) and is_local_ref(ref) and ref not in self.visited_refs:
            self.visited_refs.add(ref)
            self.walk(resolve_ref(self.root, ref), ref[1:])

    def check_object(self, node: dict, path: str) -> set[str]:
        """Reports this object's unenforced keywords; returns those whose subschemas xgrammar never reads."""
        ignored = {k for k in node if k in _NEVER_ENFORCED or k in ("then", "else")}
        for k in sorted(ignored & _NEVER_ENFORCED.keys()):
            self.report(path, k, _NEVER_ENFORCED[k])
        active = next((k for k in EXCLUSIVE_CONSTRUCTS if k in node), None)
        if active is None:
            return ignored | self.check_typed(node, path)
        for k in node:
            if k in ASSERTIONS and k != active and k not in ignored:
                ignored.add(k)
                self.report(path, k, f"xgrammar ignores '{k}' next to '{active}'")
        value = node[active]
        if active == "$ref" and not (isinstance(value, str) and is_local_ref(value)):
            self.report(path, "$ref", f"xgrammar resolves only '#' and '#/...' references, not {value!r}")
        elif active == "oneOf" and isinstance(value, list) and not oneof_is_exclusive(value, self.proof_root):
            self.report(path, "oneOf", "branches may overlap; xgrammar accepts an instance matching several")
        elif active == "allOf" and isinstance(value, list) and len(value) > 1:
            self.report(path, "allOf", "xgrammar does not enforce an allOf with several branches")
        return ignored

    def check_typed(self, node: dict, path: str) -> set[str]:
        types = inferred_types(node)
        if types is None:
            dropped = [
                k
                for t in ("number", "string", "array", "object")
                for k in TYPE_KEYWORDS[t]
                if k in node and k != "format" and k not in _NEVER_ENFORCED
            ]
            for k in dropped:
                self.report(path, k, f"xgrammar ignores '{k}' in a schema without 'type'")
            return set(dropped)
        if "multipleOf" in node and types & {"integer", "number"}:
            self.check_multiple_of(node, path, types)
        if "string" in types:
            self.check_string(node, path)
        if "array" in types and node.get("uniqueItems") is True:
            self.report(path, "uniqueItems", "xgrammar ignores 'uniqueItems'")
        if "array" in types and "contains" in node:
            for k in ("contains", "minContains", "maxContains"):
                if k in node:
                    self.report(path, k, f"xgrammar does not enforce '{k}'")
        if "object" in types:
            self.check_object_members(node, path)
        return {"contains"}

    def check_object_members(self, node: dict, path: str) -> None:
        declared = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        missing = [r for r in node.get("required", []) if isinstance(r, str) and r not in declared]
        if missing:
            self.report(path, "required", f"xgrammar ignores required names not in 'properties': {missing}")
        patterns = node.get("patternProperties") if isinstance(node.get("patternProperties"), dict) else {}
        for pattern, schema in patterns.items():
            looser = [
                k
                for k, s in declared.items()
                if search_pattern(pattern, k) and _asserted(s) != _asserted(schema)
            ]
            if looser:
                self.report(
                    path,
                    "patternProperties",
                    f"xgrammar lets {looser} through with only the schema of {pattern!r}",
                )

    def check_multiple_of(self, node: dict, path: str, types: set[str]) -> None:
        value = node["multipleOf"]
        if not is_number(value) or value <= 0:
            return
        if "number" in types:
            self.report(path, "multipleOf", "xgrammar ignores 'multipleOf' on numbers")
        elif Fraction(repr(value)).numerator == 1:
            return  # every integer is a multiple of 1/q
        elif any(k in node for k in TYPE_KEYWORDS["number"][1:]):
            self.report(path, "multipleOf", "xgrammar ignores 'multipleOf' on integers next to a bound")
        elif not float(value).is_integer():
            self.report(path, "multipleOf", "xgrammar ignores a 'multipleOf' that is not a whole number")

    def check_string(self, node: dict, path: str) -> None:
        if node.get("format") in FORMATS_XGRAMMAR:
            for k in ("pattern", "minLength", "maxLength"):
                if k in node:
                    self.report(path, k, f"xgrammar ignores '{k}' next to format {node['format']!r}")
            return
        if "pattern" in node:
            for k in ("minLength", "maxLength"):
                if k in node:
                    self.report(path, k, f"xgrammar ignores '{k}' next to 'pattern'")
            if isinstance(node["pattern"], str) and _LOOKAROUND.search(node["pattern"]):
                self.report(path, "pattern", "xgrammar drops lookahead/lookbehind from patterns")


def subschemas(node: dict, path: str, skip: set[str] = frozenset()):
    """(subschema, JSON pointer) for every place a schema object holds schemas (not $defs: reach via $ref)."""
    for key in (
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
        "additionalItems",
    ):
        if key in node and key not in skip and isinstance(node[key], dict):
            yield node[key], f"{path}/{key}"
    for key in ("properties", "patternProperties", "dependentSchemas"):
        if key in node and key not in skip and isinstance(node[key], dict):
            for name, child in node[key].items():
                yield child, f"{path}/{key}/{escape_pointer(name)}"
    for key in ("prefixItems", "anyOf", "oneOf", "allOf"):
        if key in node and key not in skip and isinstance(node[key], list):
            for i, child in enumerate(node[key]):
                yield child, f"{path}/{key}/{i}"


def escape_pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _asserted(node) -> dict:
    """The assertions of a schema object, a boolean schema as itself: equal ones accept the same."""
    return {k: v for k, v in node.items() if k in ASSERTIONS} if isinstance(node, dict) else {"": node}
