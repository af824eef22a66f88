"""Local ``$ref``s: which ones xgrammar resolves, what they point at, and whether they loop.

xgrammar resolves a ``$ref`` only when it is a JSON pointer into the same document (``#`` or ``#/...``);
any other reference matches every value.
"""

from __future__ import annotations

from urllib.parse import unquote

from .keywords import ASSERTIONS, JSON_VALUED


def is_local_ref(ref: str) -> bool:
    """A reference xgrammar resolves: the root or a JSON pointer into this document."""
    return ref == "#" or ref.startswith("#/")


def resolve_ref(root, ref: str):
    """The subschema a local JSON-pointer ``$ref`` names, or None when it does not exist."""
    node = root
    for token in ref[2:].split("/") if ref != "#" else []:
        token = unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


def has_ref_loop(root) -> bool:
    """Whether a local $ref leads back to itself without descending into the instance (as in
    ``{"$defs": {"a": {"$ref": "#/$defs/a"}}}``): evaluating such a schema never ends, and jsonschema
    dies in it (a Rust panic, not an Exception), so nothing here asks jsonschema about one."""
    found: list[str] = ["#"]
    _collect_refs(root, found)
    edges = {ref: _refs_in_place(resolve_ref(root, ref)) for ref in set(found)}
    waiting = {ref: 0 for ref in edges}  # Kahn's algorithm: what is left over lies on a loop
    for targets in edges.values():
        for target in targets:
            waiting[target] = waiting.get(target, 0) + 1
    ready = [ref for ref, count in waiting.items() if count == 0]
    while ready:
        for target in edges.get(ready.pop(), []):
            waiting[target] -= 1
            if waiting[target] == 0:
                ready.append(target)
    return any(waiting.values())


def has_ref_with_siblings(node) -> bool:
    """Whether an object anywhere in node (outside JSON values) holds a $ref next to assertions."""
    if isinstance(node, list):
        return any(has_ref_with_siblings(v) for v in node)
    if not isinstance(node, dict):
        return False
    if "$ref" in node and any(k in ASSERTIONS for k in node if k != "$ref"):
        return True
    return any(has_ref_with_siblings(v) for k, v in node.items() if k not in JSON_VALUED)


def _refs_in_place(node) -> list[str]:
    """Local $refs evaluated against the same instance as node (through in-place applicators)."""
    refs, pending = [], [node]
    while pending:
        current = pending.pop()
        if not isinstance(current, dict):
            continue
        if isinstance(current.get("$ref"), str) and is_local_ref(current["$ref"]):
            refs.append(current["$ref"])
        for key in ("allOf", "anyOf", "oneOf"):
            if isinstance(current.get(key), list):
                pending.extend(current[key])
        pending.extend(current.get(key) for key in ("not", "if", "then", "else"))
        if isinstance(current.get("dependentSchemas"), dict):
            pending.extend(current["dependentSchemas"].values())
    return refs


def _collect_refs(node, found: list[str]) -> None:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str) and is_local_ref(node["$ref"]):
            found.append(node["$ref"])
        for key, value in node.items():
            if key not in ("enum", "const", "default", "examples"):
                _collect_refs(value, found)
    elif isinstance(node, list):
        for value in node:
            _collect_refs(value, found)
