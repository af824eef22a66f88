"""Medusa heads: drafts from the target's final hidden state at the last verified position.

Greedy output must stay token-identical to decoding without drafts (float64 tiny models, batch 1 and 8,
chains and trees, with preemption and prefix caching), every page free afterwards; the heads must read
the row whose LM head gave the newest token; best-first trees keep the heads' chain as their first
branch; bad heads and options are refused by name; `specexec train-medusa` runs end to end."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from factories import tiny_executor
from medusa_heads import make_medusa_dir
from specexec.drafters.medusa.heads import load_heads
from specexec.drafters.medusa.training.data import IGNORE, draft_index, load_rows
from specexec.drafters.medusa.tree import best_first_tree
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.speculation.confidence_stop import ConfidenceStop
from specexec.executor.engine.speculation.draft_length import ForwardCostModel
from specexec.executor.executor import Executor
from specexec.sampling.tree_shape import depths, first_branch, is_tree
from speculative_runs import BATCHES, num_accepted, num_drafted, run_speculative
from tiny_models import save_tiny_model_dir


def medusa_spec(path, **extra) -> dict:
    return {"decoding_type": "Medusa", "max_draft_len": 3, "speculative_model": str(path), **extra}


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize(
    "overrides",
    [{}, {"num_kv_blocks": 40}, {"enable_prefix_caching": True}],
    ids=["plain", "preemption", "prefix-caching"],
)
def test_medusa_keeps_greedy_output_identical(tmp_path, batch, tree, overrides):
    spec = medusa_spec(make_medusa_dir(tmp_path), **({"draft_tree": True} if tree else {}))
    _, outputs = run_speculative("llama", BATCHES[batch], speculative_config=spec, **overrides)
    assert num_drafted(outputs) > 0
    if batch == "batch8":
        assert num_accepted(outputs) > 0


def test_medusa_on_a_sliding_window_target_keeps_greedy_output_identical(tmp_path):
    spec = medusa_spec(make_medusa_dir(tmp_path, "gemma3"))
    _, outputs = run_speculative("gemma3", BATCHES["batch8"], speculative_config=spec)
    assert num_drafted(outputs) > 0


def test_the_heads_read_the_state_whose_lm_head_gave_the_newest_token(tmp_path):
    """Heads that are the LM head itself (blocks adding nothing) draft the newest token again: so the row
    they are handed is the last verified position's, not one before or after it."""
    spec = medusa_spec(make_medusa_dir(tmp_path, noise=0.0))
    checked = []

    def watch(executor):
        drafter = executor.speculation.drafter
        propose = drafter.prepare_draft_tokens

        def checking(scheduled, resources):
            proposals = propose(scheduled, resources)
            for s in scheduled:
                if s.request.request_id in proposals:
                    assert proposals[s.request.request_id].token_ids[0] == s.request.token_ids[-1]
                    checked.append(s.request.request_id)
            return proposals

        drafter.prepare_draft_tokens = checking

    run_speculative("llama", BATCHES["batch8"], speculative_config=spec, before_run=watch)
    assert len(checked) > 20


def test_best_first_tree_holds_the_best_paths_with_the_chain_first():
    log_probs = [[-0.1, -2.5], [-0.7, -0.8], [-0.2, -3.0]]  # per head, best first
    tokens = [[10, 11], [20, 21], [30, 31]]
    got, parents = best_first_tree(log_probs, tokens, max_nodes=5, max_depth=3)
    assert is_tree(parents, 5)
    assert [got[i] for i in first_branch(parents)] == [10, 20, 30], "the heads' chain comes first"
    # scores: 10 -0.1, 10.20 -0.8, 10.21 -0.9, 10.20.30 -1.0, 10.21.30 -1.1, (11 -2.5 is left out)
    assert got == [10, 20, 21, 30, 30] and parents == [-1, 0, 0, 1, 2]
    chain, chain_parents = best_first_tree(log_probs, tokens, max_nodes=9, max_depth=1)
    assert chain == [10, 11] and depths(chain_parents) == [1, 1]


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (lambda d: (d / "config.json").write_text("{"), "not JSON"),
        (
            lambda d: (d / "config.json").write_text(json.dumps({"architectures": ["Llama"]})),
            "not Medusa heads",
        ),
        (
            lambda d: (d / "config.json").write_text(
                json.dumps({**json.loads((d / "config.json").read_text()), "num_heads": 3})
            ),
            "unexpected",
        ),
        (
            lambda d: (d / "config.json").write_text(
                json.dumps({**json.loads((d / "config.json").read_text()), "hidden_size": 48})
            ),
            "has shape",
        ),
        (lambda d: (d / "model.safetensors").unlink(), "no model.safetensors"),
    ],
    ids=["no-config", "bad-json", "other-architecture", "fewer-heads", "other-width", "no-weights"],
)
def test_broken_heads_are_refused_with_a_clear_error(tmp_path, breakage, message):
    make_medusa_dir(tmp_path)
    breakage(tmp_path)
    with pytest.raises(ValueError, match=message):
        load_heads(tmp_path, torch.float64, "cpu")


def test_heads_round_trip_their_layout(tmp_path):
    draft_ids = torch.tensor([0, 3, 7, 200])
    make_medusa_dir(tmp_path, num_heads=2, draft_ids=draft_ids)
    heads = load_heads(tmp_path, torch.float64, "cpu")
    assert heads.config.num_heads == 2 and heads.config.draft_vocab_size == 4
    assert heads.to_target_ids(torch.arange(4)).tolist() == draft_ids.tolist()
    assert heads(torch.zeros(3, 32, dtype=torch.float64)).shape == (3, 2, 4)


def test_more_drafts_than_heads_are_refused(tmp_path):
    spec = medusa_spec(make_medusa_dir(tmp_path, num_heads=2))
    with pytest.raises(ValueError, match="more than the heads' number"):
        tiny_executor(speculative_config=spec)


def test_heads_of_another_width_are_refused(tmp_path):
    spec = medusa_spec(make_medusa_dir(tmp_path, hidden_size=48))
    with pytest.raises(ValueError, match="hidden states of width 48"):
        tiny_executor(speculative_config=spec)


@pytest.mark.parametrize(
    ("options", "message"),
    [({"speculative_model": "/nowhere"}, "does not exist"), ({"heads": 3}, "unknown Medusa option")],
)
def test_bad_options_are_refused_before_loading(options, message):
    with pytest.raises(ValueError, match=message):
        tiny_executor(speculative_config={"decoding_type": "Medusa", **options})


def test_a_custom_target_without_heads_is_refused(tmp_path):
    config = ExecutorConfig(
        model=save_tiny_model_dir(tmp_path / "tiny"),
        dtype="float32",
        speculative_config={"decoding_type": "Medusa"},
    )
    with pytest.raises(ValueError, match="Medusa needs speculative_model"):
        Executor(config=config)


def test_each_head_learns_the_token_k_after_the_bonus_token(tmp_path):
    """Rows are the answer's positions (x_{t+1} in the answer); head k's label is x_{t+k+1} in the draft
    vocabulary, IGNORE past the end or outside it; sampled answers are left out."""
    prompt, answer = [1, 2, 3], [4, 5, 6, 9]
    rows = torch.arange(6, dtype=torch.float32)[:, None].repeat(1, 2)  # positions 0..5 fed (all but the last)
    torch.save(rows, tmp_path / "f.pt")
    records = [
        {"id": "a", "prompt_token_ids": prompt, "output_token_ids": answer, "features": "f.pt"},
        {"id": "a~s", "prompt_token_ids": prompt, "output_token_ids": answer, "features": "f.pt"},
    ]
    t2d = draft_index(torch.tensor([1, 2, 3, 4, 5, 6]), 10)  # 9 is not in the draft vocabulary
    got = load_rows(records, tmp_path, 2, t2d)
    assert got.hidden[:, 0].tolist() == [2, 3, 4, 5]  # positions 2..5: x_{t+1} = 4, 5, 6, 9
    i = IGNORE
    assert got.labels.tolist() == [[4, 5], [5, i], [i, i], [i, i]]  # draft ids of x_{t+2}, x_{t+3}


def test_train_medusa_end_to_end_on_a_tiny_model(tmp_path):
    from specexec.cli import main

    out = tmp_path / "heads"
    argv = ["train-medusa", "--output", str(out), "--model", save_tiny_model_dir(tmp_path / "tiny")]
    argv += [
        "--max-minutes",
        "0.6",
        "--corpus-minutes",
        "0.2",
        "--num-prompts",
        "6",
        "--max-new-tokens",
        "12",
    ]
    argv += ["--draft-vocab-size", "64", "--num-heads", "3", "--batch-size", "32", "--eval-every", "5"]
    assert main(argv) == 0
    log = json.loads((out / "training_log.json").read_text())
    assert log["corpus_answers"] >= 1 and log["steps_run"] > 0
    assert log["best"]["est_acceptance_length"] >= log["val"][0]["est_acceptance_length"]
    assert json.loads((out / "config.json").read_text())["num_heads"] == 3
    _, outputs = run_speculative("llama", BATCHES["batch8"], speculative_config=medusa_spec(out))
    assert num_drafted(outputs) > 0


def test_under_the_confidence_policy_chains_end_where_a_head_is_unsure(tmp_path):
    spec = medusa_spec(make_medusa_dir(tmp_path), draft_len_policy="confidence")
    attached = []

    def nearly_free_drafts(executor):  # (the measured curve, on a busy machine, may price every draft out)
        drafter = executor.speculation.drafter
        attached.append(drafter.confidence_stop)
        stop = ConfidenceStop(ForwardCostModel([1, 2], [1.0, 1.0001]))
        drafter.bind_target(dataclasses.replace(drafter.binding, confidence_stop=stop))
        drafter.confidence_stop.time_draft_step = lambda seconds: None

    executor, outputs = run_speculative(
        "llama", BATCHES["batch8"], speculative_config=spec, before_run=nearly_free_drafts
    )
    assert attached[0] is not None, "the policy gave the drafter no confidence rule"
    assert num_drafted(outputs) > 0

    class Above:  # keeps a draft while its confidence is above a half
        def keeps(self, odds, confidence, batch_size):
            return confidence > 0.5

    drafter = executor.speculation.drafter
    drafter.bind_target(dataclasses.replace(drafter.binding, confidence_stop=Above()))
    assert drafter._confident_length([math.log(0.9), math.log(0.6), math.log(0.4), math.log(0.9)], 1) == 2
