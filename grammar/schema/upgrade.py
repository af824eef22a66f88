"""upgrade_dialect(): steps 1 and 2 of normalize_schema(), a copy of the schema in the 2020-12 dialect.

Step 1 copies the targets of deep local ``$ref``s into ``$defs`` (the later steps may move what they
pointed at); step 2 rewrites draft 3-7 keywords as their 2020-12 equivalents. The step numbers are those
of the list in normalize.py.
"""

from __future__ import annotations

import copy
import re

from jsonschema import Draft202012Validator
from jsonschema.validators import validator_for

from .keywords import ASSERTIONS, JSON_VALUED, SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_VALUED
from .refs import resolve_ref

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
_OLD_DRAFTS = ("Draft3Validator", "Draft4Validator", "Draft6Validator", "Draft7Validator")


def upgrade_dialect(schema: dict) -> dict:
    """Steps 1-2 on a copy of schema: $refs into $defs, then the 2020-12 dialect (input left as it is)."""
    doc = _hoist_refs(copy.deepcopy(schema))
    _upgrade_inplace(doc, validator_for(schema, default=Draft202012Validator).__name__ in _OLD_DRAFTS)
    if "$schema" in doc:
        doc["$schema"] = DRAFT_2020_12
    return doc


def _hoist_refs(doc: dict) -> dict:
    """Step 1: copies the targets of deep local $refs into $defs and re-points those refs (in place)."""
    refs: set[str] = set()
    _visit_refs(doc, lambda node: refs.add(node["$ref"]))
    deep = sorted(
        r for r in refs if r.startswith("#/") and not re.fullmatch(r"#/(\$defs|definitions)/[^/]+", r)
    )
    defs = doc.get("$defs", {})
    if not deep or not isinstance(defs, dict):
        return doc
    moved: dict[str, str] = {}
    for ref in deep:
        target = resolve_ref(doc, ref)
        if target is not None:
            name = next(f"_ref{i}" for i in range(len(defs) + len(deep) + 1) if f"_ref{i}" not in defs)
            defs[name] = copy.deepcopy(target)
            moved[ref] = f"#/$defs/{name}"
    doc["$defs"] = defs

    def repoint(node: dict) -> None:
        node["$ref"] = moved.get(node["$ref"], node["$ref"])

    _visit_refs(doc, repoint)
    return doc


def _upgrade_inplace(node, is_old_draft: bool) -> None:
    """Step 2: rewrites draft 4-7 keywords as their 2020-12 equivalents, in every subschema."""
    if not isinstance(node, dict):
        return
    if isinstance(node.get("items"), list):
        node["prefixItems"] = node.pop("items")
        if "additionalItems" in node:
            node["items"] = node.pop("additionalItems")
    node.pop("additionalItems", None)  # means nothing without an items array
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if (
            isinstance(node.get(bound), bool)
            and node.pop(bound)
            and isinstance(node.get(limit), (int, float))
        ):
            node[bound] = node.pop(limit)
    if isinstance(node.get("dependencies"), dict):
        for name, dep in node.pop("dependencies").items():
            key = "dependentRequired" if isinstance(dep, list) else "dependentSchemas"
            node.setdefault(key, {}).setdefault(name, dep)
    if is_old_draft and "$ref" in node:
        for key in [k for k in node if k in ASSERTIONS and k != "$ref"]:
            del node[key]
    for key, value in node.items():
        if key in SCHEMA_VALUED:
            _upgrade_inplace(value, is_old_draft)
        elif key in SCHEMA_MAPS and isinstance(value, dict):
            for child in value.values():
                _upgrade_inplace(child, is_old_draft)
        elif key in SCHEMA_LISTS and isinstance(value, list):
            for child in value:
                _upgrade_inplace(child, is_old_draft)


def _visit_refs(node, visit) -> None:
    """Calls visit(obj) on every object holding a string $ref, anywhere but inside JSON values."""
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            visit(node)
        for key, value in node.items():
            if key not in JSON_VALUED:
                _visit_refs(value, visit)
    elif isinstance(node, list):
        for value in node:
            _visit_refs(value, visit)
