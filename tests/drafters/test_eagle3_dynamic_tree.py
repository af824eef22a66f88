"""EAGLE-3's dynamic (EAGLE-2) draft tree (`drafters/eagle3/dynamic_tree.py`): which nodes grow and
which are kept, and that each node the head expands under the tree mask gets the output the head gives
its path run as a plain chain (so no node attends a sibling's or a cousin's entries, and a sliding
window cuts each at its own position). Greedy identity with trees is in `test_tree_drafting.py`."""

from __future__ import annotations

import math
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from eagle3_heads import VOCAB, dense_causal_attention, make_head_dir
from specexec.drafters.base import DraftBinding
from specexec.drafters.eagle3 import tree_growth
from specexec.drafters.eagle3.drafter import Eagle3Drafter
from specexec.drafters.eagle3.dynamic_tree import DynamicTree
from specexec.drafters.eagle3.head import load_head
from specexec.executor.engine.speculation.tree_config import TreeShape
from specexec.sampling.tree_shape import is_tree

ZERO = torch.zeros(4)


def grown(num_nodes=5, max_depth=3, branching=2) -> DynamicTree:
    """Depth 1: tokens 10 (p .6) and 11 (p .3). Expanded: 10 into 20 (.45), 21 (.4); 11 into 22 (.85),
    23 (.05). Path probabilities: 10 .6, 11 .3, 20 .27, 21 .24, 22 .255, 23 .015."""
    tree = DynamicTree(1, ZERO, num_nodes, max_depth, branching)
    tree.add_children(-1, ZERO, [10, 11], [math.log(0.6), math.log(0.3)])
    tree.choose_frontier(1)
    tree.add_children(0, ZERO, [20, 21], [math.log(0.45), math.log(0.4)])
    tree.add_children(1, ZERO, [22, 23], [math.log(0.85), math.log(0.05)])
    return tree


def test_the_best_paths_are_kept_level_by_level_children_most_likely_first():
    proposal = grown().proposal()
    # kept: 10 .6, 11 .3, 20 .27, 22 .255, 21 .24 (not 23)
    assert proposal.token_ids == [10, 11, 20, 21, 22]
    assert proposal.parents == [-1, -1, 0, 0, 1]
    assert is_tree(proposal.parents)


def test_the_frontier_is_the_best_of_its_depth_and_the_tree_stops_at_its_depth():
    tree = grown(num_nodes=9, max_depth=3)
    assert [tree.nodes[i].token for i in tree.fed] == [10, 11]
    assert tree.choose_frontier(2)
    assert [tree.nodes[i].token for i in tree.frontier] == [20, 22]  # .27 and .255 over .24 and .015
    tokens, parents, hidden = tree.forward_rows()
    assert tokens == [1, 10, 11, 20, 22] and parents == [-1, -1, 0, 1] and hidden.shape == (5, 4)
    assert not tree.choose_frontier(3), "depth 3 is the step's deepest: its nodes are leaves"


def test_a_small_budget_keeps_a_prefix_closed_tree():
    for num_nodes in range(1, 7):
        proposal = grown(num_nodes=num_nodes).proposal()
        assert len(proposal.token_ids) == num_nodes and is_tree(proposal.parents)
    assert grown(num_nodes=2).proposal().token_ids == [10, 11]


@pytest.mark.parametrize("window", [None, 6, 30])
def test_each_expanded_node_gets_the_output_of_its_path_run_as_a_chain(tmp_path, window, monkeypatch):
    """A 20-token prompt, trees 4 deep with 3 children per node: every output the head computes under
    the tree mask equals the head run densely over the prompt's positions and the node's path."""
    make_head_dir(tmp_path, sliding_window=window)
    head = load_head(tmp_path, torch.nn.Embedding(VOCAB, 32).double(), torch.float64, "cpu")
    drafter = Eagle3Drafter(head, 4, VOCAB, 4, block_size=4)
    drafter.bind_target(DraftBinding(draft_tree=TreeShape(max_nodes=12, branching=3)))
    tokens = list(range(20, 40))
    features = torch.randn(19, 96, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    request = SimpleNamespace(request_id="r", token_ids=tokens, num_tokens=20, target_hidden=[(0, features)])
    outputs = []
    add_children = tree_growth.add_children

    def recording(head, branching, expanded, out, logits):
        outputs.extend((tree, node, out[i]) for i, (tree, node) in enumerate(expanded))
        add_children(head, branching, expanded, out, logits)

    monkeypatch.setattr(tree_growth, "add_children", recording)
    assert drafter._take_features(request)
    hidden, logits, roots = drafter._catch_up([request])
    proposals = tree_growth.grow_trees(drafter, [(request, 4)], {"r": 12}, roots, hidden, logits)
    assert len(proposals["r"].token_ids) == 12 and is_tree(proposals["r"].parents)
    assert grown(num_nodes=1).frontier == [], "a one-node tree expands nothing"
    expanded = [(tree, node, out) for tree, node, out in outputs if node >= 0]
    assert len(expanded) == 3 + 3 + 3, "three nodes expanded at each of depths 1, 2 and 3"

    attend = partial(dense_causal_attention, window=window)
    with torch.no_grad():
        real = head.step(torch.tensor(tokens[1:]), head.fuse(features), torch.arange(19), attend)
        for tree, node, out in expanded:
            path = []
            while node >= 0:
                path.insert(0, tree.nodes[node].token)
                node = tree.nodes[node].parent
            rows, inputs = real, head.fuse(features)
            for j in range(len(path)):  # the chain: each draft fed its predecessor's output
                inputs = torch.cat([inputs, rows[-1:]])
                ids = torch.tensor(tokens[1:] + path[: j + 1])
                rows = head.step(ids, inputs, torch.arange(20 + j), attend)
            torch.testing.assert_close(out, rows[-1], rtol=1e-9, atol=1e-9)
    drafter.release(request)
    assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks


def test_tree_growth_is_dynamic_or_siblings():
    from specexec.drafters.eagle3.options import Eagle3Options

    assert Eagle3Options().tree_growth == "dynamic"
    with pytest.raises(ValueError, match="tree_growth must be one of dynamic, siblings"):
        Eagle3Options(tree_growth="bushy")
