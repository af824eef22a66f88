"""``speculative_config.draft_tree``: drafts as a token tree instead of one chain.

    speculative_config:
      decoding_type: Eagle
      max_draft_len: 3        # the tree's depth
      draft_tree: true        # the drafter's measured default shape, or
      draft_tree: {max_nodes: 9, branching: 3}

A drafter that can draft trees says so with its ``default_tree`` (`drafters/base.py`); the others refuse
the key. The scheduler counts a tree's nodes as draft slots, one forward verifies them under a tree
attention mask, and verification walks the tree (`sampling/tree_verify.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ....sampling.tree_shape import MAX_TREE_ROWS

MAX_BRANCHING = 16


@dataclass(frozen=True, slots=True)
class TreeShape:
    """How big a drafter's trees may grow each step."""

    max_nodes: int  #: drafts per request per step, every branch together (2..63)
    branching: int  #: children per node at most (2..16)

    def __post_init__(self) -> None:
        for name, low, high in (("max_nodes", 2, MAX_TREE_ROWS - 1), ("branching", 2, MAX_BRANCHING)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(
                    f"speculative_config.draft_tree.{name} must be an integer in {low}..{high}, got {value!r}"
                )

    def nodes_for_depth(self, depth: int) -> int:
        """The slots a tree of this depth reserves: ``branching`` nodes per level, at most ``max_nodes``."""
        return min(self.max_nodes, depth * self.branching)


def check_draft_tree_value(value: Any) -> None:
    """The key's value as written: null, true/false, or a mapping of ``max_nodes`` and ``branching``."""
    if value is None or isinstance(value, bool):
        return
    if not isinstance(value, dict):
        raise ValueError(f"speculative_config.draft_tree must be true, false or a mapping, got {value!r}")
    unknown = sorted(set(value) - {"max_nodes", "branching"})
    if unknown:
        raise ValueError(
            f"unknown speculative_config.draft_tree key(s) {unknown}; known: branching, max_nodes"
        )
    TreeShape(value.get("max_nodes", 2), value.get("branching", 2))


def resolve_draft_tree(value: Any, drafter) -> TreeShape | None:
    """The shape the executor runs for the config's ``draft_tree`` and this drafter (None: chains)."""
    if not value:
        return None
    default = getattr(drafter, "default_tree", None)
    if default is None:
        raise ValueError(
            f"speculative_config.draft_tree: {type(drafter).__name__} drafts chains only; the drafters "
            "that draft trees are NGram, Eagle, Lookahead and Medusa"
        )
    if value is True:
        return default
    return TreeShape(value.get("max_nodes", default.max_nodes), value.get("branching", default.branching))
