"""The executor's side of token trees (`sampling/tree_shape.py`): what a step may verify as a tree, and,
once verified, the accepted branch laid out as a chain.

A tree is verified where every row's logits are the model's own, or masked by the request's grammar at
the row's place in the tree; one with repetition, frequency or presence penalties, or one still under
``min_tokens``, verifies its tree's first branch as a chain. After the walk (`sampling/tree_verify.py`) the accepted
branch is moved in place: its logits and hidden-state rows come first, its drafts lead the request's
list, and its K/V move from the nodes' slots to the slots right after the root, so that every later
stage (log-probabilities, the drafter's hidden states, the page rewind, prefix caching) sees a chain
whose first ``len(path)`` drafts were accepted.
"""

from __future__ import annotations

import torch

from ....sampling.tree_shape import depths, first_branch, is_chain, pruned
from ..scheduler import ScheduledRequest


def verifies_trees(request) -> bool:
    """Whether the request's rows can be verified as a tree: its logit stages depend on the row's own
    place only (a grammar masks each node's row after its path: `grammar/request_grammar.py`), not on
    the tokens before it as a chain (penalties, ``min_tokens``)."""
    params = request.sampling_params
    under_min_tokens = params.min_tokens and request.num_output_tokens < params.min_tokens
    return not params.has_penalties and not under_min_tokens


def shape_tree(s: ScheduledRequest, tokens: list[int], parents: list[int], trees_on: bool) -> None:
    """Set the step's drafts from a checked tree: nodes deeper than ``max_draft_depth`` dropped, the
    first branch alone where the request cannot verify a tree (or ``draft_tree`` is off), a
    chain-shaped tree as a chain."""
    node_depths = depths(parents)
    if trees_on and max(node_depths, default=0) > s.max_draft_depth:
        kept, parents = pruned(parents, [d <= s.max_draft_depth for d in node_depths])
        tokens, node_depths = [tokens[i] for i in kept], [node_depths[i] for i in kept]
    if not trees_on or not verifies_trees(s.request):
        branch = first_branch(parents)
        tokens, parents, node_depths = [tokens[i] for i in branch], list(range(-1, len(branch) - 1)), []
    s.draft_token_ids = tokens
    s.draft_probs = None  # a tree is verified without q
    s.draft_parents = None if is_chain(parents) else parents
    s.tree_depth = max(node_depths, default=0) if s.draft_parents is not None else 0


def settle_tree_rows(s: ScheduledRequest, output, index: int, path: list[int]) -> None:
    """Lay the request's rows out as a chain whose first drafts are the accepted ``path``: its logit
    rows, its hidden-state rows and its drafts (root first, then the path, then the other nodes)."""
    num_nodes = len(s.draft_token_ids)
    on_path = set(path)
    order = [0] + [1 + n for n in path] + [1 + n for n in range(num_nodes) if n not in on_path]
    s.draft_token_ids = [s.draft_token_ids[i - 1] for i in order[1:]]
    s.draft_parents = None
    if order == list(range(num_nodes + 1)):
        return
    rows = torch.tensor(order, device=output.logits.device)
    first = output.cu_logit_rows[index]
    start = output.cu_tokens[index] + s.num_new_tokens - 1  # the root's row among the tokens
    with torch.inference_mode():  # (the forward's outputs are inference tensors)
        output.logits[first : first + num_nodes + 1] = output.logits[first + rows]
        for hidden in output.hidden_states.values():
            hidden[start : start + num_nodes + 1] = hidden[start + rows.to(hidden.device)]


def move_accepted_kv(kv_cache, block_table: list[int], root_pos: int, path: list[int]) -> None:
    """Copy the K/V of the accepted nodes (node i at slot root + 1 + i) to the chain's slots (the j-th
    accepted at root + 1 + j), in every layer of ``kv_cache`` (a `KVCache`: [layers, 2, slots, ...])."""
    moves = [(root_pos + 1 + node, root_pos + 1 + j) for j, node in enumerate(path) if node != j]
    if not moves:
        return
    bs = kv_cache.block_size
    src, dst = ([block_table[p // bs] * bs + p % bs for p in side] for side in zip(*moves))
    device = kv_cache.kv.device
    src_t, dst_t = torch.tensor(src, device=device), torch.tensor(dst, device=device)
    with torch.inference_mode():
        kv_cache.kv.index_copy_(2, dst_t, kv_cache.kv.index_select(2, src_t))
