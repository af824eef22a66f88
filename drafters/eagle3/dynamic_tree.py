"""EAGLE-2's dynamic draft tree, grown by the EAGLE-3 head (Li et al., 2024, "EAGLE-2").

A node's score is its path probability under the head: the product of the head's probabilities of the
tokens from the root down to it, the head's estimate that the target accepts the whole path. Each
depth the head expands the ``branching`` nodes of that depth with the highest scores, each into its
``branching`` most likely children; at the end the request keeps its ``num_nodes`` best-scored nodes.
A child never scores above its parent, so the nodes kept are closed under ancestors.

This module keeps one request's tree: its nodes, which of them the head has been fed, and what the next
head forward over the tree looks like (`DynamicTree.forward_rows`). The drafter runs that forward
(`drafter.py`): the tree so far as one sequence under a tree mask, from the last real position (the
root, recomputed from the same inputs, so its K/V are rewritten unchanged) through every expanded
node, the newest depth's nodes last so theirs are the logit rows read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..base import DraftProposal


@dataclass(slots=True)
class TreeNode:
    token: int  #: a target id
    parent: int  #: index in `DynamicTree.nodes`; -1: the root
    depth: int  #: 1 for the root's children
    log_score: float  #: log of the path probability
    parent_out: torch.Tensor  # [hidden] the head output whose logits proposed this node (its input when fed)


class DynamicTree:
    """One request's tree for one step."""

    def __init__(
        self,
        root_token: int,
        root_input: torch.Tensor,  # [hidden] the fused target features at the last real position
        num_nodes: int,
        max_depth: int,
        branching: int,
    ) -> None:
        self.root_token = root_token
        self.root_input = root_input
        self.num_nodes = num_nodes
        self.max_depth = max_depth
        self.branching = branching
        self.nodes: list[TreeNode] = []
        self.fed: list[int] = []  #: nodes the head has been fed, parents before children
        self.frontier: list[int] = []  #: the nodes the next forward expands (fed last)

    def add_children(
        self,
        parent: int,
        out: torch.Tensor,  # [hidden] the head's output at `parent` (-1: at the root)
        tokens: list[int],  # the head's top tokens there, as target ids, most likely first
        log_probs: list[float],  # their log-probabilities
    ) -> None:
        base = self.nodes[parent].log_score if parent >= 0 else 0.0
        depth = self.nodes[parent].depth + 1 if parent >= 0 else 1
        for token, log_prob in zip(tokens, log_probs):
            self.nodes.append(TreeNode(token, parent, depth, base + log_prob, out))

    def choose_frontier(self, depth: int) -> bool:
        """Mark the ``branching`` best nodes of ``depth`` to expand next; False when the tree stops
        growing here (the deepest level the step allows, or no node there)."""
        if depth >= self.max_depth:
            self.frontier = []
            return False
        level = [i for i, node in enumerate(self.nodes) if node.depth == depth]
        # (at most num_nodes - depth of them can be kept with a child: never expand more)
        width = min(self.branching, self.num_nodes - depth)
        self.frontier = sorted(level, key=lambda i: -self.nodes[i].log_score)[: max(0, width)]
        self.fed.extend(self.frontier)
        return bool(self.frontier)

    def forward_rows(self) -> tuple[list[int], list[int], torch.Tensor]:
        """The next head forward over this tree: its tokens (the root's first, then each fed node's),
        the fed nodes' parents as rows of that tree (-1: the root) and its hidden inputs
        [1 + len(fed), hidden]. The frontier is fed last: its rows are the sequence's last."""
        row_of = {node: row for row, node in enumerate(self.fed)}
        tokens = [self.root_token] + [self.nodes[i].token for i in self.fed]
        parents = [row_of.get(self.nodes[i].parent, -1) for i in self.fed]
        hidden = torch.stack([self.root_input] + [self.nodes[i].parent_out for i in self.fed])
        return tokens, parents, hidden

    def proposal(self) -> DraftProposal:
        """The ``num_nodes`` best-scored nodes as a tree, level by level, each node's children most
        likely first (so the tree's first branch follows the best-scored child at every depth)."""
        best = sorted(range(len(self.nodes)), key=lambda i: (-self.nodes[i].log_score, self.nodes[i].depth))
        kept = set(best[: self.num_nodes])
        kept = {i for i in kept if self._ancestors_kept(i, kept)}  # (ties at probability 1 only)
        new_index: dict[int, int] = {-1: -1}
        tokens: list[int] = []
        parents: list[int] = []
        for depth in range(1, self.max_depth + 1):  # (a level's parents are numbered before it is sorted)
            level = [i for i in kept if self.nodes[i].depth == depth]
            level.sort(key=lambda i: (new_index[self.nodes[i].parent], -self.nodes[i].log_score))
            for i in level:
                new_index[i] = len(tokens)
                tokens.append(self.nodes[i].token)
                parents.append(new_index[self.nodes[i].parent])
        return DraftProposal(tokens, parents=parents)

    def _ancestors_kept(self, i: int, kept: set[int]) -> bool:
        parent = self.nodes[i].parent
        while parent >= 0:
            if parent not in kept:
                return False
            parent = self.nodes[parent].parent
        return True
