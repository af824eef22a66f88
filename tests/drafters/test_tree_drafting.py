"""Token trees of drafts (`speculative_config.draft_tree`): verified in one forward under a tree mask,
walked by `sampling/tree_verify.py`, the accepted branch's K/V moved into place.

An oracle drafter knows each request's greedy output and hides it in one branch of a tree whose other
branches are garbage (the first branch always is): the output must stay token-identical to decoding
without drafts, most drafts of the true branch must be accepted (so the tree mask is right: a node that
attended a garbage sibling would score another token), and every page must be free afterwards. The
same under preemption, chunked prefill and prefix caching; with sampling, the samples must be the plain
ones seed for seed and pass the chi-square test.
"""

from __future__ import annotations

import pytest
import specexec.executor.engine.engine_core as engine_core
from oracle_tree_drafter import OracleTreeDrafter
from sampled_distribution import (
    P_VALUE_THRESHOLD,
    chi_square_p_value,
    exact_distribution,
    plain_samples,
    sample_sequences,
)
from specexec.drafters.base import Drafter, DraftProposal
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.speculation.tree_config import TreeShape
from specexec.executor.executor import Executor
from speculative_runs import BATCHES, num_accepted, reference, run_speculative
from tiny_models import make_tiny_model

TREE_SPEC = {"decoding_type": "Oracle", "draft_tree": True, "draft_len_policy": "fixed"}


def oracle(arch: str, prompts, max_tokens: int = 16) -> OracleTreeDrafter:
    expected = reference(arch, prompts, max_tokens)
    return OracleTreeDrafter({f"r{i}": out for i, out in enumerate(expected)}, vocab=256)


@pytest.fixture
def kv_moves(monkeypatch):
    """The accepted paths whose K/V moved (the true branch is never the first)."""
    moves = []
    move = engine_core.move_accepted_kv

    def recording(kv_cache, table, root, path):
        moves.append(list(path))
        return move(kv_cache, table, root, path)

    monkeypatch.setattr(engine_core, "move_accepted_kv", recording)
    return moves


@pytest.mark.parametrize("batch", BATCHES)
def test_the_true_branch_of_a_tree_is_accepted_and_the_output_is_unchanged(batch, kv_moves):
    drafter = oracle("llama", BATCHES[batch])
    executor, outputs = run_speculative(
        "llama", BATCHES[batch], drafter=drafter, speculative_config=TREE_SPEC
    )
    assert drafter.num_trees > 0 and kv_moves, "no tree was verified"
    # the true branch is nodes 1, 4, 7, ... and every draft of it is the greedy token: all accepted
    assert all(path == [1 + 3 * j for j in range(len(path))] for path in kv_moves), kv_moves
    assert num_accepted(outputs) == sum(map(len, kv_moves)) >= 2 * len(kv_moves)
    assert executor.speculation.stats.num_garbage_answers == 0


@pytest.mark.parametrize("case", ["preemption", "chunked-prefill", "prefix-caching"])
def test_trees_keep_greedy_output_identical_under_pressure(case, kv_moves):
    prompts = BATCHES["batch8"]
    overrides = {
        "preemption": {"num_kv_blocks": 40},
        "chunked-prefill": {"max_num_tokens": 16},
        "prefix-caching": {"enable_prefix_caching": True},
    }[case]
    drafter = oracle("llama", prompts)
    executor, outputs = run_speculative(
        "llama", prompts, drafter=drafter, speculative_config=TREE_SPEC, **overrides
    )
    assert kv_moves and num_accepted(outputs) > 0
    if case == "preemption":
        assert sum(o.metrics.num_preemptions for o in outputs) > 0


@pytest.mark.parametrize("shape", [{"max_nodes": 6, "branching": 2}, {"max_nodes": 14, "branching": 4}])
def test_ngram_trees_keep_greedy_output_identical(shape):
    spec = {"decoding_type": "NGram", "max_draft_len": 4, "draft_tree": shape, "draft_len_policy": "fixed"}
    executor, outputs = run_speculative("llama", BATCHES["batch8"], speculative_config=spec)
    assert executor.speculation.drafter.draft_tree == TreeShape(**shape)
    assert num_accepted(outputs) > 0


def test_garbage_trees_cost_only_their_drafts():
    class BadParents(Drafter):
        runs_on_loop_thread = True
        default_tree = TreeShape(max_nodes=6, branching=2)

        def propose(self, request, num_slots, resources):
            cases = ([0, 0], [-1, 5], [-1, "x"], None)
            bad = cases[request.num_output_tokens % len(cases)]
            return DraftProposal([3, 4], parents=bad if bad is not None else [-1])

    executor, _ = run_speculative(
        "llama", BATCHES["batch8"], drafter=BadParents(3), speculative_config=TREE_SPEC
    )
    assert executor.speculation.stats.num_garbage_answers > 0


# ---- configuration -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"max_nodes": 1}, "max_nodes must be an integer in 2..63"),
        ({"max_nodes": 64}, "max_nodes must be an integer in 2..63"),
        ({"branching": 1}, "branching must be an integer in 2..16"),
        ({"width": 3}, "unknown speculative_config.draft_tree key"),
        ("yes", "must be true, false or a mapping"),
    ],
)
def test_bad_draft_tree_values_are_refused_by_name(value, message):
    with pytest.raises(ValueError, match=message):
        ExecutorConfig(speculative_config={"decoding_type": "NGram", "draft_tree": value})


@pytest.mark.parametrize(
    ("arch", "decoding_type", "message"),
    [("llama", "DraftTarget", "drafts chains only"), ("gemma3", "NGram", "sliding-window")],
)
def test_draft_tree_is_refused_where_trees_do_not_run(arch, decoding_type, message):
    """A drafter of chains only, and a target with sliding-window attention."""
    _, model = make_tiny_model(arch)
    spec = {"decoding_type": decoding_type, "draft_tree": True}
    with pytest.raises(ValueError, match=message):
        Executor(
            model, ExecutorConfig(dtype="float64", device="cpu", num_kv_blocks=64, speculative_config=spec)
        )


# ---- sampling ----------------------------------------------------------------------------------------------


class EveryTokenTree(Drafter):
    """Every pair of tokens {a, b} at each of two levels: a deterministic tree of 6 nodes."""

    runs_on_loop_thread = True
    default_tree = TreeShape(max_nodes=6, branching=2)

    def __init__(self, a: int, b: int) -> None:
        super().__init__(2)
        self.a, self.b = a, b

    def propose(self, request, num_slots, resources):
        a, b = self.a, self.b
        return DraftProposal([a, b, a, b, a, b][:num_slots], parents=[-1, -1, 0, 0, 1, 1][:num_slots])


@pytest.fixture(scope="module")
def tree_samples():
    counts = exact_distribution()
    second = sorted({seq[1] for seq in counts}, key=lambda t: -sum(p for s, p in counts.items() if s[1] == t))
    return sample_sequences(EveryTokenTree(second[0], second[1]), speculative_config=TREE_SPEC)


def test_tree_sampling_matches_the_target_distribution(tree_samples):
    _, outputs, counts = tree_samples
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    assert accepted > 0
    p_value, cells = chi_square_p_value(counts, exact_distribution())
    assert p_value > P_VALUE_THRESHOLD, f"p = {p_value:.2e} over {cells} cells"


def test_tree_sampling_reproduces_the_plain_samples_seed_for_seed(tree_samples):
    _, outputs, _ = tree_samples
    mismatches = [i for i, (o, want) in enumerate(zip(outputs, plain_samples())) if o.token_ids != want]
    assert not mismatches, f"{len(mismatches)} seeded requests changed, e.g. request {mismatches[0]}"


@pytest.mark.parametrize("growth", ["dynamic", "siblings"])
@pytest.mark.parametrize("batch", BATCHES)
def test_eagle_trees_keep_greedy_output_identical(tmp_path, batch, kv_moves, growth, monkeypatch):
    from eagle3_heads import eagle_spec, make_head_dir
    from specexec.drafters.eagle3 import tree_growth

    make_head_dir(tmp_path)
    spec = {
        **eagle_spec(tmp_path, k=3),
        "draft_tree": {"max_nodes": 9, "branching": 3},
        "tree_growth": growth,
    }
    trees = []

    def count_trees(executor):
        drafter = executor.speculation.drafter
        prepare = drafter.prepare_draft_tokens

        def recording(scheduled, resources):
            proposals = prepare(scheduled, resources)
            trees.extend(p for p in proposals.values() if p.parents is not None)
            return proposals

        drafter.prepare_draft_tokens = recording

    def grown(drafter, ready, *args):
        grown_for.extend(r.request_id for r, _ in ready)
        return grow_trees(drafter, ready, *args)

    grow_trees = tree_growth.grow_trees
    monkeypatch.setattr(tree_growth, "grow_trees", grown)
    grown_for = []
    run_speculative("llama", BATCHES[batch], speculative_config=spec, before_run=count_trees)
    assert trees and all(len(p.token_ids) <= 9 for p in trees)
    assert any(len(p.token_ids) > 3 for p in trees), "no tree was drafted"
    if growth == "dynamic":
        assert grown_for, "no dynamic tree was grown (the head's, not prompt lookup's)"
    else:
        assert not grown_for
