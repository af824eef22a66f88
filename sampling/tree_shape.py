"""The shape of a token tree of drafts: parents per node, in the order the drafter gave them.

A tree of ``n`` drafts is ``parents[n]``: node ``i``'s parent is ``parents[i]`` (``-1``: the root, the
token the step feeds after the last verified one), and every parent comes before its children
(``-1 <= parents[i] < i``). A chain is ``[-1, 0, 1, ...]``. In a forward, the root is row 0 and node
``i`` row ``i + 1``; node ``i`` sits at position ``root + depth(i)``.
"""

from __future__ import annotations

from collections.abc import Sequence

#: a tree's rows (root and nodes) must fit one int64 of ancestor bits
MAX_TREE_ROWS = 64


def is_tree(parents: Sequence[int], num_nodes: int | None = None) -> bool:
    """Whether ``parents`` is a valid tree (of ``num_nodes`` nodes, if given)."""
    if num_nodes is not None and len(parents) != num_nodes:
        return False
    return len(parents) < MAX_TREE_ROWS and all(type(p) is int and -1 <= p < i for i, p in enumerate(parents))


def is_chain(parents: Sequence[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth: 1 for the root's children."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def row_ancestor_bits(parents: Sequence[int]) -> list[int]:
    """Per row (the root, then each node), the rows it attends among the step's new ones: bit ``j`` set
    when row ``j`` is the row itself or one of its ancestors (the root is everyone's). As signed
    int64 values (row 63 is the sign bit)."""
    bits = [1]
    for i, p in enumerate(parents):
        bits.append(bits[p + 1] | (1 << (i + 1)))
    return [b - (1 << 64) if b >= 1 << 63 else b for b in bits]


def first_branch(parents: Sequence[int]) -> list[int]:
    """The nodes of the tree's first branch: the root's first child, its first child, and so on (the
    drafter's own first choice at every depth)."""
    branch: list[int] = []
    at = -1
    for i, p in enumerate(parents):
        if p == at:
            branch.append(i)
            at = i
    return branch


def pruned(parents: Sequence[int], keep: Sequence[bool]) -> tuple[list[int], list[int]]:
    """The subtree of the nodes ``keep`` marks whose ancestors are all kept too: (the kept nodes' old
    indices, their parents renumbered)."""
    new_index: dict[int, int] = {-1: -1}
    kept: list[int] = []
    new_parents: list[int] = []
    for i, p in enumerate(parents):
        if keep[i] and p in new_index:
            new_index[i] = len(kept)
            kept.append(i)
            new_parents.append(new_index[p])
    return kept, new_parents


def trie_of_chains(
    chains: Sequence[Sequence[int]], max_nodes: int, max_depth: int, max_children: int = MAX_TREE_ROWS
) -> tuple[list[int], list[int]]:
    """One tree holding the given continuations, in preference order: (tokens, parents). The first
    chain is the first branch; later chains add the nodes they do not share with earlier ones, each cut
    at ``max_depth`` tokens (and where its node would be a parent's child beyond ``max_children``),
    until ``max_nodes`` nodes are placed."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    num_children: dict[int, int] = {}
    for chain in chains:
        at = -1
        for token in list(chain)[:max_depth]:
            node = children.get((at, token))
            if node is None:
                if len(tokens) >= max_nodes or num_children.get(at, 0) >= max_children:
                    break
                node = children[(at, token)] = len(tokens)
                num_children[at] = num_children.get(at, 0) + 1
                tokens.append(token)
                parents.append(at)
            at = node
        if len(tokens) >= max_nodes:
            break
    return tokens, parents
