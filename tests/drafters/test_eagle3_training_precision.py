"""`specexec train-eagle3`: the training precision (float32 or bfloat16 autocast, chosen by timing the
first steps) and ``--init-from`` (training an existing head further)."""

from __future__ import annotations

import json

import pytest
import torch
from eagle3_heads import dense_causal_attention, make_features, make_head_dir
from specexec.drafters.eagle3.head import load_head
from specexec.drafters.eagle3.training.checkpoint import CHECKPOINT_NAME, load_checkpoint
from specexec.drafters.eagle3.training.train_loop import make_batch
from specexec.drafters.eagle3.training.ttt import ttt_loss
from specexec.drafters.training import precision as training_precision
from specexec.drafters.training.precision import TRIAL_STEPS, TrainingPrecision
from tiny_models import save_tiny_model_dir


def test_auto_tries_both_precisions_then_keeps_the_faster_per_position(monkeypatch):
    monkeypatch.setattr(training_precision, "native_bf16_flags", lambda: ["avx512_bf16"])
    precision = TrainingPrecision("auto")
    seen = []
    while precision.chosen is None:
        mode = precision.next()
        seen.append(mode)
        # bfloat16 steps are twice the positions in 1.5x the time: faster per position
        precision.record(mode, 1.5 if mode == "bfloat16" else 1.0, 200 if mode == "bfloat16" else 100)
    assert seen.count("float32") == seen.count("bfloat16") == TRIAL_STEPS
    assert precision.chosen == "bfloat16" and precision.next() == "bfloat16"
    assert "0.75x" in precision.reason
    precision.record("float32", 0.001, 100)  # decided: later timings change nothing
    assert precision.chosen == "bfloat16"


def test_auto_is_float32_without_native_bfloat16_and_fixed_choices_are_kept(monkeypatch):
    monkeypatch.setattr(training_precision, "native_bf16_flags", lambda: [])
    assert TrainingPrecision("auto").next() == "float32"
    assert TrainingPrecision("bfloat16").next() == "bfloat16"
    with pytest.raises(ValueError, match="--train-dtype"):
        TrainingPrecision("float16")


def test_a_bfloat16_autocast_step_computes_nearly_the_float32_loss(tmp_path):
    head = load_head(make_head_dir(tmp_path), torch.nn.Embedding(256, 32), torch.float32, "cpu")
    head.train().requires_grad_(True)
    feats = [make_features(20, seed=s) for s in range(3)]
    lm_rows = torch.randn(96, 32)  # the head's 96-token draft vocabulary
    in_draft = torch.zeros(256, dtype=torch.bool)
    in_draft[:96] = True
    batch = make_batch(feats, lm_rows, in_draft, max_len=16)
    precision = TrainingPrecision("bfloat16")
    with precision.autocast("bfloat16"):
        low, _, _ = ttt_loss(head, batch, 2)
    with torch.no_grad():
        full, _, _ = ttt_loss(head, batch, 2)
    low.backward()  # the backward runs (outside the autocast context)
    assert low.dtype == torch.float32
    assert abs(low.detach().item() - full.item()) < 0.05 * abs(full.item())
    assert all(p.grad is not None for p in head.parameters() if p.requires_grad)


def tiny_precision_training_argv(model_dir, out) -> list[str]:
    argv = ["train-eagle3", "--output", str(out), "--model", model_dir, "--max-minutes", "0.6"]
    argv += ["--corpus-minutes", "0.15", "--num-prompts", "6", "--max-new-tokens", "8"]
    return argv + ["--self-instruct", "3", "--ttt-steps", "2", "--max-len", "48", "--batch-tokens", "96"]


def test_init_from_trains_an_existing_head_further_with_its_vocabulary(tmp_path):
    from specexec.cli import main

    model_dir = save_tiny_model_dir(tmp_path / "tiny")
    first = tmp_path / "first"
    assert main([*tiny_precision_training_argv(model_dir, first), "--draft-vocab-size", "64"]) == 0
    second = tmp_path / "second"
    argv = [
        *tiny_precision_training_argv(model_dir, second),
        "--draft-vocab-size",
        "32",
        "--init-from",
        str(first),
    ]
    assert main(argv) == 0
    start = load_head(first, torch.nn.Embedding(256, 32), torch.float32, "cpu")
    checkpoint = load_checkpoint(second / CHECKPOINT_NAME)
    assert torch.equal(checkpoint["draft_ids"], start.t2d.nonzero()[:, 0]), "not the start head's vocabulary"
    assert json.loads((second / "config.json").read_text())["draft_vocab_size"] == 64
    log = json.loads((second / "training_log.json").read_text())
    assert log["val"][0]["step"] == 0, "the start head was not measured before training"
    assert log["precision"]["chosen"] in ("float32", "bfloat16")


def test_init_from_refuses_a_head_of_another_shape(tmp_path, capsys):
    from specexec.cli import main

    model_dir = save_tiny_model_dir(tmp_path / "tiny")
    head_dir = make_head_dir(tmp_path / "other", aux_layers=(0, 0, 0))
    assert (
        main([*tiny_precision_training_argv(model_dir, tmp_path / "out"), "--init-from", str(head_dir)]) == 2
    )
    assert "does not fit the target: aux_layer_ids (0, 0, 0)" in capsys.readouterr().err


@pytest.mark.parametrize("window", ["49", "2", "-1"])
def test_a_sliding_window_past_the_trained_positions_or_within_the_unrolled_steps_is_refused(
    tmp_path, window, capsys
):
    """--max-len 48 and --ttt-steps 2: the window must hold the unrolled steps' own keys and no more
    positions than a sequence is trained on."""
    from specexec.cli import main

    argv = tiny_precision_training_argv(str(tmp_path / "no-model"), tmp_path / "out")
    assert main([*argv, "--sliding-window", window]) == 2
    assert "--sliding-window 0 or in --ttt-steps + 1..--max-len" in capsys.readouterr().err
    assert not (tmp_path / "out").exists(), "refused before any work"


def test_a_fresh_vocabulary_keeps_the_trained_rows_of_the_tokens_it_keeps(tmp_path):
    from specexec.drafters.eagle3.training.reshape import with_draft_vocab

    make_head_dir(tmp_path, draft_vocab=64, draft_ids=range(0, 128, 2))  # the even ids below 128
    head = load_head(tmp_path, torch.nn.Embedding(256, 32), torch.float32, "cpu")
    new_ids = torch.arange(64, 160)  # 32 kept (even 64..126), 64 new
    output_rows = torch.randn(256, 32)  # the target's lm_head
    fresh = with_draft_vocab(head, new_ids, output_rows)
    shift = (head.lm_head.weight - output_rows[0:128:2]).mean(0)
    assert fresh.config.draft_vocab_size == 96
    assert torch.equal(fresh.t2d.nonzero()[:, 0], new_ids)
    assert torch.equal(new_ids, torch.arange(96) + fresh.d2t)
    for i, token in enumerate(new_ids.tolist()):
        if token < 128 and token % 2 == 0:
            assert torch.equal(fresh.lm_head.weight[i], head.lm_head.weight[token // 2])
        else:
            torch.testing.assert_close(fresh.lm_head.weight[i], output_rows[token] + shift)
    for name, tensor in head.state_dict().items():
        if not name.startswith(("lm_head.", "d2t", "t2d")):
            assert torch.equal(fresh.state_dict()[name], tensor), name
    rows = torch.randn(5, 32)
    kept = torch.arange(0, 64, 2)  # rows of the kept tokens in the new vocabulary
    with torch.no_grad():
        torch.testing.assert_close(fresh.logits(rows)[:, kept], head.logits(rows)[:, 32:64])


def test_fresh_vocab_trains_a_head_further_over_the_corpus_vocabulary(tmp_path, capsys):
    from specexec.cli import main

    model_dir = save_tiny_model_dir(tmp_path / "tiny")
    first = tmp_path / "first"
    assert main([*tiny_precision_training_argv(model_dir, first), "--draft-vocab-size", "64"]) == 0
    second = tmp_path / "second"
    argv = [
        *tiny_precision_training_argv(model_dir, second),
        "--draft-vocab-size",
        "48",
        "--init-from",
        str(first),
    ]
    assert main([*argv, "--fresh-vocab"]) == 0
    assert json.loads((second / "config.json").read_text())["draft_vocab_size"] == 48
    start = load_head(first, torch.nn.Embedding(256, 32), torch.float32, "cpu")
    draft_ids = load_checkpoint(second / CHECKPOINT_NAME)["draft_ids"]
    assert len(draft_ids) == 48 and not torch.equal(draft_ids, start.t2d.nonzero()[:, 0][:48])
    assert main([*argv, "--fresh-vocab"]) == 0, "a rerun does not continue its checkpoint"
    assert torch.equal(load_checkpoint(second / CHECKPOINT_NAME)["draft_ids"], draft_ids)
    assert main([*tiny_precision_training_argv(model_dir, tmp_path / "third"), "--fresh-vocab"]) == 2
    assert "--fresh-vocab only with --init-from" in capsys.readouterr().err


def test_a_wider_mlp_drafts_what_the_head_did_until_training_moves_it(tmp_path):
    from specexec.drafters.eagle3.training.reshape import with_mlp_width

    head = load_head(make_head_dir(tmp_path), torch.nn.Embedding(256, 32), torch.float32, "cpu")
    wide = with_mlp_width(head, 96)  # 64 units -> 96
    assert wide.config.intermediate_size == 96 and wide.midlayer.mlp.down_proj.weight.shape == (32, 96)
    assert torch.equal(wide.midlayer.mlp.gate_proj.weight[:64], head.midlayer.mlp.gate_proj.weight)
    assert wide.midlayer.mlp.up_proj.weight[64:].std() > 0, "the new units start dead"
    ids, features, positions = torch.randint(0, 256, (7,)), torch.randn(7, 96), torch.arange(7)
    with torch.no_grad():
        before = head.logits(head.step(ids, head.fuse(features), positions, dense_causal_attention))
    after = wide.logits(wide.step(ids, wide.fuse(features), positions, dense_causal_attention))
    torch.testing.assert_close(after, before)
    after.logsumexp(-1).sum().backward()
    assert wide.midlayer.mlp.down_proj.weight.grad[:, 64:].abs().sum() > 0, "the new units never learn"
    assert with_mlp_width(head, 64) is head
    with pytest.raises(ValueError, match="--mlp-width 32: the head to start from already has 64"):
        with_mlp_width(head, 32)


def test_mlp_width_trains_a_wider_head_further_and_a_rerun_must_name_it(tmp_path, capsys):
    from specexec.cli import main

    model_dir = save_tiny_model_dir(tmp_path / "tiny")
    first = tmp_path / "first"
    assert main([*tiny_precision_training_argv(model_dir, first), "--draft-vocab-size", "64"]) == 0
    width = json.loads((first / "config.json").read_text())["intermediate_size"]
    second = tmp_path / "second"
    argv = [*tiny_precision_training_argv(model_dir, second), "--init-from", str(first)]
    assert main([*argv, "--mlp-width", str(2 * width)]) == 0
    assert json.loads((second / "config.json").read_text())["intermediate_size"] == 2 * width
    start = load_head(first, torch.nn.Embedding(256, 32), torch.float32, "cpu")
    log = json.loads((second / "training_log.json").read_text())
    assert log["val"][0]["step"] == 0 and log["steps"], "the widened head was not measured, then trained"
    assert torch.equal(load_checkpoint(second / CHECKPOINT_NAME)["draft_ids"], start.t2d.nonzero()[:, 0])
    assert main(argv) == 2, "a rerun without --mlp-width continued a head of another width"
    assert f"holds a head with {2 * width} MLP units: pass --mlp-width {2 * width}" in capsys.readouterr().err
