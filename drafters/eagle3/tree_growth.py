"""The EAGLE-3 head growing dynamic trees (`dynamic_tree.py`) for the requests of one drafting call: which
requests grow one, the head cache slots a tree takes, and one head forward per depth over every tree
so far (each as one sequence under a tree mask, from the last real position, recomputed, through
every expanded node, the newest depth last so its rows are the logit rows read)."""

from __future__ import annotations

import torch

from ...executor.model.forward_io import SequenceInput
from ..base import DraftProposal
from .dynamic_tree import DynamicTree


def grows_tree(drafter, scheduled, text: tuple[int, ...]) -> bool:
    """Whether this request's drafts grow as a dynamic tree: a tree step, and none of what drafts a
    chain (a grammar, sampled drafts, a continuation of its own text, the confidence rule)."""
    r = scheduled.request
    return (
        drafter.draft_tree is not None
        and drafter.tree_growth == "dynamic"
        and scheduled.max_draft_depth > 1
        and not text
        and drafter.grammar_of(r) is None
        and not (drafter.returns_draft_probs and not r.sampling_params.is_greedy)
        and drafter.confidence_stop is None
    )


def feed_slots(drafter, depth: int) -> int:
    """Head cache slots a dynamic tree of ``depth`` takes past the real ones: its fed nodes."""
    return max(drafter.max_draft_len, (depth - 1) * drafter.draft_tree.branching)


def grow_trees(drafter, ready, num_nodes, root_inputs, hidden, logits) -> dict[str, DraftProposal]:
    """A dynamic tree per request of ``ready`` ((request, depth) pairs) within its ``num_nodes``, from
    the catch-up's output ``hidden`` [R, hidden] and ``logits`` [R, draft_vocab] at each root and the
    fused features fed there (``root_inputs``)."""
    branching, cache, bm = drafter.draft_tree.branching, drafter.cache, drafter.block_manager
    trees = {
        r.request_id: DynamicTree(
            r.token_ids[-1], root_inputs[r.request_id], num_nodes[r.request_id], depth, branching
        )
        for r, depth in ready
    }
    add_children(drafter.head, branching, [(trees[r.request_id], -1) for r, _ in ready], hidden, logits)
    depth, growing = 1, [r for r, _ in ready]
    while True:
        growing = [r for r in growing if trees[r.request_id].choose_frontier(depth)]
        # the fed nodes' slots follow the real ones (the root, recomputed, is the last real one)
        fed_end = {
            r.request_id: cache.states[r.request_id].num_real + len(trees[r.request_id].fed) for r in growing
        }
        if not growing or not cache.reserve_up_to(growing, fed_end):
            break
        seqs, inputs, expanded = [], [], []
        for r in growing:
            tree, rid = trees[r.request_id], r.request_id
            tokens, parents, rows = tree.forward_rows()
            root_pos = cache.states[rid].num_real - 1
            seqs.append(SequenceInput(tokens, root_pos, bm.block_tables[rid], len(tree.frontier), parents))
            inputs.append(rows)
            expanded.extend((tree, node) for node in tree.frontier)
        out, node_logits = drafter._forward(seqs, torch.cat(inputs))
        add_children(drafter.head, branching, expanded, out, node_logits)
        depth += 1
    return {rid: tree.proposal() for rid, tree in trees.items()}


def add_children(head, branching: int, expanded: list, out: torch.Tensor, logits: torch.Tensor) -> None:
    """Each (tree, node) of ``expanded`` gets the head's top ``branching`` tokens at its row of ``out``
    [N, hidden] / ``logits`` [N, draft_vocab] as children (node -1: the root)."""
    top = torch.log_softmax(logits.float(), dim=-1).topk(branching, dim=-1)
    targets = head.to_target_ids(top.indices)  # [N, branching]
    rows = torch.stack([targets.double(), top.values.double()], dim=1).tolist()  # [N, 2, branching]
    for i, ((tree, node), (tokens, log_probs)) in enumerate(zip(expanded, rows)):
        tree.add_children(node, out[i], [int(t) for t in tokens], log_probs)
