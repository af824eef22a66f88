"""Lookahead decoding: the Jacobi window's iterate comes back from the target and feeds the n-gram
pool; greedy output stays token-identical (chains and trees, batch 1 and 8, preemption, prefix
caching), and the pieces behave as the paper's: diagonal n-grams, a bounded pool, a window that moves
past the emitted tokens."""

from __future__ import annotations

import pytest
from specexec.drafters.lookahead.jacobi import JacobiState, NGramPool
from specexec.executor.config import ExecutorConfig
from specexec.executor.executor import Executor
from speculative_runs import BATCHES, num_accepted, num_drafted, run_speculative
from tiny_models import make_tiny_model


def spec(tree: bool, **options) -> dict:
    return {"decoding_type": "Lookahead", "max_draft_len": 3, "draft_tree": tree, **options}


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_lookahead_keeps_greedy_output_identical_and_learns_the_iterates(batch, tree):
    learned = []

    def spy(executor):
        drafter = executor.speculation.drafter
        states = drafter._states

        class Recording(dict):
            def __setitem__(self, key, state):
                take = state.take_iterate
                state.take_iterate = lambda root, outputs: learned.append(outputs) or take(root, outputs)
                super().__setitem__(key, state)

        drafter._states = Recording(states)

    _, outputs = run_speculative("llama", BATCHES[batch], speculative_config=spec(tree), before_run=spy)
    assert num_drafted(outputs) > 0 and num_accepted(outputs) > 0
    assert learned and all(len(o) >= 2 for o in learned), "no Jacobi iterate came back"


@pytest.mark.parametrize("overrides", [{"num_kv_blocks": 40}, {"enable_prefix_caching": True}])
def test_lookahead_trees_under_preemption_and_prefix_caching(overrides):
    _, outputs = run_speculative("llama", BATCHES["batch8"], speculative_config=spec(True), **overrides)
    assert num_accepted(outputs) > 0


def test_the_pool_learns_the_diagonal_of_successive_windows():
    state = JacobiState(window_size=3, ngram_size=3, pool_size=4)
    state.window, state.window_start = [10, 11, 12], 5  # iteration 1: guesses for positions 5, 6, 7
    state.take_iterate(4, [20, 21, 22, 23])  # its iterate: guesses for 5..8
    assert state.pool.entries == {}, "one iteration is not a diagonal of three tokens"
    state.window_for(4, [1, 2, 3, 4, 9], 3)  # nothing emitted meanwhile: the window is the iterate
    assert state.window == [20, 21, 22] and state.window_start == 5
    state.take_iterate(4, [30, 31, 32, 33])
    # q = 5: iteration 1's guess at 5, iteration 2's at 6, the newest iterate's at 7
    assert state.pool.continuations(10, 4) == [(21, 32)]
    assert state.pool.continuations(11, 4) == [(22, 33)]


def test_the_window_moves_past_the_emitted_tokens():
    state = JacobiState(window_size=3, ngram_size=2, pool_size=4)
    state.take_iterate(9, [7, 8, 9, 6])  # guesses for 10..13
    assert state.window_for(11, list(range(12)), 2) == [9, 6]  # two tokens emitted: from position 12
    assert state.window_start == 12


def test_the_pool_keeps_the_newest_ngrams_per_token():
    pool = NGramPool(size=2)
    for gram in ([1, 2, 3], [1, 4, 5], [1, 2, 3], [1, 6, 7]):
        pool.add(gram)
    assert pool.continuations(1, 5) == [(6, 7), (2, 3)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"window_size": 0}, "window_size"),
        ({"ngram_size": 1}, "ngram_size"),
        ({"pool": 3}, "unknown Lookahead option"),
    ],
)
def test_bad_options_are_refused_before_loading(options, message):
    _, model = make_tiny_model("llama")
    with pytest.raises(ValueError, match=message):
        Executor(
            model,
            ExecutorConfig(
                dtype="float64", device="cpu", num_kv_blocks=64, speculative_config=spec(False, **options)
            ),
        )
