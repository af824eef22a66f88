"""Medusa's token trees, chosen each step from the heads' own log-probabilities.

Every head proposes its ``branching`` likeliest tokens. A path through the levels (head 1's i-th token,
then head 2's j-th, ...) is scored by the sum of its tokens' log-probabilities, as if the heads were
independent (they read the same hidden state and none sees the tokens before its own); the tree holds
the ``max_nodes`` best-scored paths' nodes, grown best first. A child never scores above its parent,
so every node comes after its parent, and the heads' top-1 chain is the tree's first branch (at each
depth it outscores every other node there). The tree depends on the context only, so the walk over it
is lossless (`sampling/tree_verify.py`).
"""

from __future__ import annotations

import heapq


def best_first_tree(
    top_log_probs: list[list[float]], top_tokens: list[list[int]], max_nodes: int, max_depth: int
) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the tree: per level ``d`` (head ``d + 1``) its candidates' log-probabilities
    ``top_log_probs[d]`` and target ids ``top_tokens[d]``, each list best first; at most ``max_nodes``
    nodes and ``max_depth`` levels."""
    max_depth = min(max_depth, len(top_tokens))
    tokens: list[int] = []
    parents: list[int] = []
    order = 0  # ties go to the earlier pushed (the better-ranked sibling)
    frontier: list[tuple[float, int, int, int, int]] = []  # (-score, order, depth, rank, parent)

    def push_children(score: float, depth: int, parent: int) -> None:
        nonlocal order
        if depth >= max_depth:
            return
        for rank, log_prob in enumerate(top_log_probs[depth]):
            heapq.heappush(frontier, (-(score + log_prob), order, depth, rank, parent))
            order += 1

    push_children(0.0, 0, -1)
    while frontier and len(tokens) < max_nodes:
        neg_score, _, depth, rank, parent = heapq.heappop(frontier)
        tokens.append(top_tokens[depth][rank])
        parents.append(parent)
        push_children(-neg_score, depth + 1, len(tokens) - 1)
    return tokens, parents
