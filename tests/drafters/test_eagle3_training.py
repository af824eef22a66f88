"""EAGLE-3 training: the training-time test computes what drafting computes, the corpus never holds a
benchmark prompt, and `specexec train-eagle3` runs end to end (on a tiny model) into a loadable head."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch
from eagle3_heads import dense_causal_attention, make_features, make_head_dir
from specexec.drafters.eagle3.head import load_head
from specexec.drafters.eagle3.training.prompts import mix_prompts
from specexec.drafters.eagle3.training.train_loop import make_batch
from specexec.drafters.eagle3.training.ttt import ttt_loss
from specexec.drafters.training.bundled_prompts import (
    MAX_BENCH_REQUESTS,
    MAX_BENCH_REQUESTS_PER_CATEGORY,
    SPECBENCH_CATEGORIES,
    TRAINING_DATASETS,
    training_prompts,
)
from specexec.drafters.training.draft_vocab import choose_draft_vocab, d2t_for
from specexec.prompt_sets.datasets import load_dataset, spread, spread_order
from speculative_runs import BATCHES, run_speculative
from tiny_models import save_tiny_model_dir


@pytest.mark.parametrize("window", [None, 4])
def test_each_unrolled_step_equals_drafting_after_that_position(tmp_path, window):
    """Step k at index t of the training-time test = the k-th chained draft step after position t
    (teacher-forced tokens), computed densely like inference does (with the head's sliding window:
    step k's query, at position t + k, sees the last ``window`` positions up to its own)."""
    make_head_dir(tmp_path, draft_vocab=96, sliding_window=window)
    head = load_head(tmp_path, torch.nn.Embedding(256, 32).double(), torch.float64, "cpu")
    feats = [make_features(12, 0), make_features(9, 1)]
    lm_rows = torch.randn(96, 32)
    in_draft = torch.ones(256, dtype=torch.bool)
    batch = make_batch(feats, lm_rows, in_draft, max_len=64)
    steps = 3
    outputs = []
    original = head.step

    def step_and_keep(*args):  # each unrolled step's outputs at every index
        out = original(*args)
        outputs.append(out.detach().clone())
        return out

    head.step = step_and_keep
    with torch.no_grad():
        ttt_loss(head, batch, steps)
    head.step = original
    b, t = batch.next_ids.shape
    for j, f in enumerate(feats):
        n = len(f.aux) - 1
        for index in (0, 3, n - steps):
            real = head.fuse(f.aux[: index + 1])  # rows of positions start..start+index
            ids = f.token_ids[1 : index + 2]
            hidden = real
            for k in range(steps):
                pos = torch.arange(f.start_pos, f.start_pos + len(ids))
                out = head.step(ids, hidden, pos, partial(dense_causal_attention, window=window))
                torch.testing.assert_close(outputs[k].view(b, t, -1)[j, index], out[-1], rtol=1e-9, atol=1e-9)
                hidden = torch.cat([hidden, out[-1:]])
                ids = torch.cat([ids, f.token_ids[index + 2 + k : index + 3 + k]])


def test_only_answer_targets_are_scored():
    """A prompt's positions are context, not training targets: index i (position start + i) is scored
    only when the token it predicts (position start + i + 2) is the answer's."""
    f = make_features(12, 0)
    f.answer_start = f.start_pos + 7  # the answer's first token sits at index 5's target
    batch = make_batch([f], torch.randn(96, 32), torch.ones(256, dtype=torch.bool), max_len=64)
    n = len(f.aux) - 1
    assert batch.valid[0, :n].tolist() == [False] * 5 + [True] * (n - 5)
    assert batch.real[0, :n].all()  # still fed: the head attends the prompt's keys


def test_agreement_counts_answer_targets_outside_the_draft_vocabulary_as_misses(tmp_path):
    """The loss can only score targets inside the draft vocabulary, but the agreement is over every
    answer target: a smaller vocabulary cannot look better by leaving its misses out."""
    make_head_dir(tmp_path, draft_vocab=96)
    head = load_head(tmp_path, torch.nn.Embedding(256, 32).double(), torch.float64, "cpu")
    f = make_features(40, 0)
    f.answer_start = f.start_pos + 12
    lm_rows = torch.randn(96, 32)
    everything = torch.ones(256, dtype=torch.bool)
    full = make_batch([f], lm_rows, everything, max_len=64)
    full.target_ids = torch.zeros_like(full.target_ids)  # the head's argmax, forced below
    head.logits = lambda rows: torch.nn.functional.one_hot(
        torch.zeros(len(rows), dtype=torch.long), 96
    ).double()
    with torch.no_grad():
        _, _, agree_all = ttt_loss(head, full, 2)
    assert agree_all == [1.0, 1.0]
    some = everything.clone()
    some[f.token_ids[2 + 10 :: 2]] = False  # about half of the answer's targets leave the vocabulary
    part = make_batch([f], lm_rows, some, max_len=64)
    part.target_ids = torch.zeros_like(part.target_ids)
    with torch.no_grad():
        _, _, agree_part = ttt_loss(head, part, 2)
    for k in range(2):
        scored = int((part.valid[:, k:] & part.real[:, : part.real.shape[1] - k]).sum())
        answer = int((part.answer[:, k:] & part.real[:, : part.real.shape[1] - k]).sum())
        assert 0 < scored < answer
        assert agree_part[k] == pytest.approx(scored / answer)


def test_training_prompts_never_include_a_benchmark_draw():
    train_ids = {p.id for p in training_prompts()}
    for name, _ in TRAINING_DATASETS:
        prompts = load_dataset(name)
        for n in (1, 2, 6, 8, 10, 33, MAX_BENCH_REQUESTS):
            assert not train_ids & {p.id for p in load_dataset(name, n)}, (name, n)
        assert train_ids & {p.id for p in prompts}, f"{name} gives no training prompt"
    for category in SPECBENCH_CATEGORIES:
        drawn = {p.id for p in load_dataset(f"specbench:{category}", MAX_BENCH_REQUESTS_PER_CATEGORY)}
        assert not train_ids & drawn, category


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_every_prefix_of_the_mix_takes_the_pools_share(share):
    bundled, pool = [f"b{i}" for i in range(300)], [f"p{i}" for i in range(100)]
    mixed = mix_prompts(bundled, pool, share)
    assert sorted(mixed) == sorted(bundled + pool), "every prompt once"
    assert [m for m in mixed if m[0] == "b"] == bundled and [m for m in mixed if m[0] == "p"] == pool
    for n in range(1, len(mixed) + 1):  # while both last, the pool's part of the first n is its share
        taken = sum(m[0] == "p" for m in mixed[:n])
        if taken < len(pool) and n - taken < len(bundled):
            assert abs(taken - share * n) <= 1, (n, taken)
    if share > 0:
        assert mixed[0][0] == "p", "the pool starts at once, not after the bundle"


def test_a_share_outside_0_to_1_is_refused():
    with pytest.raises(ValueError, match="share"):
        mix_prompts(["b"], ["p"], 1.5)


@pytest.mark.parametrize("length", [1, 2, 3, 7, 10, 80, 480])
def test_spread_order_visits_every_index_once_and_draws_nest(length):
    order = spread_order(length)
    assert sorted(order) == list(range(length))
    items = list(range(length))
    for n in range(1, length):
        assert set(spread(items, n)) <= set(spread(items, n + 1))


def test_draft_vocab_takes_the_most_frequent_tokens_and_eos():
    records = [{"prompt_token_ids": [5, 5, 6], "output_token_ids": [7, 7, 7, 8]}]
    ids = choose_draft_vocab(records, 4, 100, always=(99,))
    assert ids.tolist() == [5, 7, 8, 99]  # answer tokens count twice: 8 (2 x 1) outranks 6 (1)
    assert (torch.arange(4) + d2t_for(ids)).tolist() == [5, 7, 8, 99]
    with pytest.raises(ValueError, match="draft vocabulary size"):
        choose_draft_vocab(records, 101, 100)


def test_train_eagle3_end_to_end_on_a_tiny_model(tmp_path):
    from specexec.cli import main

    model_dir = save_tiny_model_dir(tmp_path / "tiny")
    out = tmp_path / "head"
    argv = ["train-eagle3", "--output", str(out), "--model", model_dir, "--max-minutes", "1.5"]
    argv += [
        "--corpus-minutes",
        "0.2",
        "--num-prompts",
        "6",
        "--max-new-tokens",
        "8",
        "--draft-vocab-size",
        "64",
    ]
    argv += ["--ttt-steps", "2", "--max-len", "48", "--batch-tokens", "96", "--self-instruct", "4"]
    argv += ["--sliding-window", "16"]
    assert main(argv) == 0
    size = json.loads((out / "corpus" / "size.json").read_text())
    pool = (out / "corpus" / "prompt_pool.jsonl").read_text().splitlines()
    assert size["prompt_pool"] == len(pool) >= 1, "the target wrote no instruction"
    assert size["sampled_sequences"] >= 1 and size["positions"] > 0
    log = json.loads((out / "training_log.json").read_text())
    assert log["corpus_records"] >= 1 and log["steps"], "no corpus or no optimizer step"
    assert log["total_minutes"] < 2.0
    assert (out / "loss_curve.png").stat().st_size > 0
    assert len((out / "corpus" / "corpus.jsonl").read_text().splitlines()) == log["corpus_records"]
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 64
    assert config["sliding_window"] == 16, "the head drafts with the window it was trained with"
    # the trained head drafts for the tiny target (float64 for the identity check)
    _, outputs = run_speculative(
        "llama",
        BATCHES["batch8"],
        speculative_config={"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model": str(out)},
    )
    assert sum(o.metrics.num_draft_tokens for o in outputs) > 0


def test_corpus_only_runs_continue_the_same_corpus(tmp_path):
    """Each `--corpus-only` run appends to the corpus the last one left (nothing is answered twice)."""
    from specexec.cli import main

    model_dir = save_tiny_model_dir(tmp_path / "tiny")
    out = tmp_path / "head"
    argv = [
        "train-eagle3",
        "--output",
        str(out),
        "--model",
        model_dir,
        "--corpus-only",
        "--max-new-tokens",
        "6",
    ]
    argv += ["--self-instruct", "6", "--draft-vocab-size", "64", "--corpus-minutes", "0.3"]
    assert main([*argv, "--num-prompts", "3"]) == 0
    first = json.loads((out / "corpus" / "size.json").read_text())
    assert main([*argv, "--num-prompts", "6"]) == 0
    second = json.loads((out / "corpus" / "size.json").read_text())
    ids = [json.loads(line)["id"] for line in (out / "corpus" / "corpus.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == second["sequences"] > first["sequences"]
    assert not (out / "config.json").exists(), "--corpus-only trains nothing"


def test_answer_passes_take_long_prompts_apart_window_by_window():
    """Long prompts run apart and fewer at once, but window by window of the prompt order, so a run cut
    short by its time budget still reaches the long prompts near the front."""
    from specexec.drafters.training.corpus import (
        LONG_PROMPT_BATCH_DIVISOR,
        WINDOW_BATCHES,
        answer_passes,
    )

    batch = LONG_PROMPT_BATCH_DIVISOR * 2  # long prompts two at a time
    window = WINDOW_BATCHES * batch
    answers = [(f"r{i}", i % 5 == 0) for i in range(window + 10)]
    passes = answer_passes(answers, batch)
    first_long = [f"r{i}" for i in range(0, window, 5)]
    assert passes[0] == [f"r{i}" for i in range(window) if i % 5]
    assert passes[1 : 1 + len(first_long) // 2] == [
        first_long[i : i + 2] for i in range(0, len(first_long), 2)
    ]
    assert passes[1 + len(first_long) // 2] == [f"r{i}" for i in range(window, window + 10) if i % 5]
    assert sorted(r for p in passes for r in p) == sorted(r for r, _ in answers)


def test_long_prompts_are_answered_apart_and_fewer_at_once(tmp_path, monkeypatch):
    """Decode attention over many long contexts at once crawls on a CPU, so the corpus answers prompts
    over ``long_prompt_tokens`` after the short ones of their window, max_batch_size // 8 at a time;
    every answer is kept."""
    from specexec.drafters.training.corpus import generate_corpus
    from specexec.executor.executor import Executor
    from specexec.prompt_sets.datasets import BenchPrompt
    from transformers import AutoTokenizer

    model_dir = save_tiny_model_dir(tmp_path / "tiny")
    prompts = [
        BenchPrompt(f"p{i}", [{"role": "user", "content": "word " * (30 if i % 3 == 0 else 3)}])
        for i in range(6)
    ]
    tok = AutoTokenizer.from_pretrained(model_dir)
    length = {
        p.id: len(
            tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        )
        for p in prompts
    }
    threshold = max(length[p.id] for i, p in enumerate(prompts) if i % 3)
    assert all(length[p.id] > threshold for i, p in enumerate(prompts) if i % 3 == 0)
    streamed: list[list[str]] = []
    real_stream = Executor.stream

    def recording_stream(self, requests, *args, **kwargs):
        requests = list(requests)
        streamed.append([r.request_id for r in requests])
        return real_stream(self, requests, *args, **kwargs)

    monkeypatch.setattr(Executor, "stream", recording_stream)
    records = generate_corpus(
        tmp_path / "corpus" / "corpus.jsonl",
        (1, 2),
        num_prompts=6,
        max_tokens=4,
        max_batch_size=8,
        long_prompt_tokens=threshold,
        model=model_dir,
        prompts=prompts,
        sampled_temperature=0.7,
    )
    short = [f"p{i}{s}" for i in (1, 2, 4, 5) for s in ("", "~s")]
    assert streamed == [short, ["p0"], ["p0~s"], ["p3"], ["p3~s"]]
    assert sorted(r["id"] for r in records) == sorted([*short, "p0", "p0~s", "p3", "p3~s"])
    assert all((tmp_path / "corpus" / r["features"]).exists() for r in records)


def tiny_training_run(tmp_path, max_minutes: str) -> tuple[list[str], Path]:
    """`train-eagle3` on a tiny target saved in ``tmp_path``: a corpus of 6 prompts for 9 s, then
    training for the rest of ``max_minutes``; also the head's directory."""
    out = tmp_path / "head"
    argv = ["train-eagle3", "--output", str(out), "--model", save_tiny_model_dir(tmp_path / "tiny")]
    argv += ["--max-minutes", max_minutes, "--corpus-minutes", "0.15", "--num-prompts", "6"]
    argv += ["--max-new-tokens", "8", "--self-instruct", "3", "--draft-vocab-size", "64", "--ttt-steps", "2"]
    argv += ["--max-len", "48", "--batch-tokens", "96"]
    return argv, out


def test_training_continues_from_its_checkpoint_with_the_same_vocabulary_and_split(tmp_path):
    import torch
    from specexec.cli import main
    from specexec.drafters.eagle3.training.checkpoint import CHECKPOINT_NAME, load_checkpoint
    from specexec.drafters.training.validation_split import is_validation, split_records

    argv, out = tiny_training_run(tmp_path, "0.3")
    argv += ["--eval-every", "5", "--patience", "1000"]
    assert main(argv) == 0
    first = load_checkpoint(out / CHECKPOINT_NAME)
    assert first is not None and first["state"].step > 0
    assert main(argv) == 0
    second = load_checkpoint(out / CHECKPOINT_NAME)
    assert second["state"].step > first["state"].step, "the second run did not continue the first"
    assert torch.equal(second["draft_ids"], first["draft_ids"])
    log = json.loads((out / "training_log.json").read_text())
    assert [run["first_step"] for run in log["runs"]] == [1, first["state"].step + 1]
    assert [s["step"] for s in log["steps"]] == list(range(1, second["state"].step + 1))
    assert log["train_seconds"] > first["state"].log["train_seconds"] > 0, "a run's training time was lost"
    records = [{"id": f"p{i}"} for i in range(200)] + [{"id": f"p{i}~s"} for i in range(200)]
    train, val = split_records(records)
    assert val and all(is_validation(r["id"]) == is_validation(r["id"].removesuffix("~s")) for r in records)
    assert {r["id"].removesuffix("~s") for r in val}.isdisjoint(r["id"].removesuffix("~s") for r in train)


def test_a_changed_validation_split_scores_the_best_head_again(tmp_path):
    """A grown corpus grows the validation split: the best score of an earlier run was measured on other
    sequences, so the next run scores the best head and the current one again instead of keeping a
    number no new evaluation can compare with (and ending with the old best head because of it)."""
    import torch
    from specexec.cli import main
    from specexec.drafters.eagle3.training.checkpoint import CHECKPOINT_NAME, load_checkpoint
    from specexec.drafters.training.corpus import read_corpus
    from specexec.drafters.training.validation_split import split_records, validation_key

    argv, out = tiny_training_run(tmp_path, "0.3")
    argv += ["--eval-every", "5", "--patience", "1000"]
    assert main(argv) == 0
    first = load_checkpoint(out / CHECKPOINT_NAME)
    split = validation_key(split_records(read_corpus(out / "corpus" / "corpus.jsonl"))[1])
    assert first["state"].val_key == split
    saved = torch.load(out / CHECKPOINT_NAME, weights_only=False)
    saved["state"].update(val_key="a split of another corpus", best_score=99.0)
    torch.save(saved, out / CHECKPOINT_NAME)

    assert main([*argv, "--corpus-minutes", "0"]) == 0
    second = load_checkpoint(out / CHECKPOINT_NAME)
    assert second["state"].val_key == split
    assert second["state"].best_score < 99.0, "the score from another split was kept"
    log = json.loads((out / "training_log.json").read_text())
    second_run = log["val"][len(first["state"].log["val"]) :]
    assert [v["step"] for v in second_run[:2]] == [first["state"].step] * 2, "best and current not rescored"
    assert second["state"].best_score == max(v["est_acceptance_length"] for v in second_run)


def test_training_stops_early_when_validation_stops_improving(tmp_path):
    from specexec.cli import main

    argv, out = tiny_training_run(tmp_path, "1.0")
    argv += ["--eval-every", "1", "--patience", "2", "--lr", "0"]  # a head that never changes never improves
    assert main(argv) == 0
    log = json.loads((out / "training_log.json").read_text())
    assert log["stopped"] == "validation stopped improving" and log["best_step"] <= 1


def test_the_training_device_is_the_gpu_when_there_is_one_and_a_missing_one_is_refused():
    from specexec.drafters.training.machine import training_device

    assert training_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert training_device("cpu") == torch.device("cpu")
    for wrong in ("tpu", "meta", "cuda:x"):
        with pytest.raises(ValueError, match=f"--device {wrong}: unsupported device"):
            training_device(wrong)
    missing = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ValueError, match=f"--device {missing}: .*(CUDA is not available|does not exist)"):
        training_device(missing)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_head_trained_on_the_gpu_continues_on_the_cpu_and_drafts_there(tmp_path):
    """The corpus answered and the head trained on CUDA; its checkpoint continues on the CPU (the
    tensors it holds load there), and the head it writes drafts for the CPU executor."""
    from specexec.cli import main
    from specexec.drafters.eagle3.training.checkpoint import CHECKPOINT_NAME

    argv, out = tiny_training_run(tmp_path, "0.6")
    assert main([*argv, "--device", "cuda", "--eval-every", "5"]) == 0
    log = json.loads((out / "training_log.json").read_text())
    assert log["steps"] and log["precision"]["chosen"] in ("float32", "bfloat16")
    assert main([*argv, "--device", "cpu", "--eval-every", "5", "--corpus-minutes", "0"]) == 0
    resumed = json.loads((out / "training_log.json").read_text())
    assert len(resumed["runs"]) == 2 and resumed["steps"][-1]["step"] > log["steps"][-1]["step"]
    assert (out / CHECKPOINT_NAME).exists()
    _, outputs = run_speculative(
        "llama",
        BATCHES["batch8"],
        speculative_config={"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model": str(out)},
    )
    assert sum(o.metrics.num_draft_tokens for o in outputs) > 0
