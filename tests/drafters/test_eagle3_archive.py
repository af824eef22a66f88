"""The training corpus's token archive (EAGLE-3's and Medusa's): append-only token shards that outlive
the corpus directory, one target's only, from which a new machine rebuilds the same corpus by prefill
instead of answering again."""

from __future__ import annotations

import copy
import gzip
import json

import pytest
import torch
from specexec.drafters.training.archive import ARCHIVE_FILE, CorpusArchive, target_fingerprint
from specexec.drafters.training.corpus import read_corpus
from tiny_models import make_tiny_model, save_tiny_model_dir


def answer(i: int) -> dict:
    return {"id": f"p{i}", "prompt_token_ids": [1, 2, i], "output_token_ids": [i, 5, 6], "features": "x.pt"}


def instruction(seed: int) -> dict:
    return {"id": f"si-{seed}", "prompt": f"Explain item {seed}.", "hash": str(seed), "seed": seed}


def test_exports_add_only_what_is_new_in_new_shards(tmp_path):
    archive = CorpusArchive(tmp_path / "archive")
    assert archive.answers() == [] and archive.instructions() == []
    assert archive.export([answer(0), answer(1)], [instruction(0)]) == {"answers": 2, "instructions": 1}
    first = (tmp_path / "archive" / "answers-0001.jsonl.gz").read_bytes()
    counts = archive.export([answer(0), answer(1), answer(2)], [instruction(0), instruction(1)])
    assert counts == {"answers": 1, "instructions": 1}
    assert (tmp_path / "archive" / "answers-0001.jsonl.gz").read_bytes() == first, "an old shard changed"
    with gzip.open(tmp_path / "archive" / "answers-0002.jsonl.gz", "rt") as f:
        assert [json.loads(line)["id"] for line in f] == ["p2"]
    kept = {k: v for k, v in answer(2).items() if k != "features"}
    assert archive.answers() == [{k: v for k, v in answer(i).items() if k != "features"} for i in (0, 1)] + [
        kept
    ]
    assert [r["id"] for r in archive.instructions()] == ["si-0", "si-1"]
    assert archive.export([answer(2)], [instruction(1)]) == {"answers": 0, "instructions": 0}
    assert sorted(p.name for p in (tmp_path / "archive").iterdir()) == [
        "answers-0001.jsonl.gz",
        "answers-0002.jsonl.gz",
        "pool-0001.jsonl.gz",
        "pool-0002.jsonl.gz",
    ]


def test_restore_pool_appends_only_the_missing_instructions(tmp_path):
    from specexec.drafters.eagle3.training.prompts import read_pool

    archive = CorpusArchive(tmp_path / "archive")
    archive.export([], [instruction(s) for s in range(4)])
    pool = tmp_path / "corpus" / "prompt_pool.jsonl"
    pool.parent.mkdir()
    pool.write_text(json.dumps(instruction(1)) + "\n")
    assert archive.restore_pool(pool) == 3
    assert [r["id"] for r in read_pool(pool)] == ["si-1", "si-0", "si-2", "si-3"]
    assert archive.restore_pool(pool) == 0


def test_an_archive_serves_only_the_target_that_answered():
    _, model = make_tiny_model("llama", dtype=torch.float32)
    as_bf16 = copy.deepcopy(model).to(torch.bfloat16)
    _, other = make_tiny_model("qwen2", dtype=torch.float32)
    assert target_fingerprint(model) == target_fingerprint(as_bf16)
    assert target_fingerprint(model) != target_fingerprint(other)


def test_another_targets_archive_is_refused(tmp_path):
    archive = CorpusArchive(tmp_path / "archive")
    archive.check_target("llama-a")
    archive.check_target("llama-a")
    assert json.loads((tmp_path / "archive" / ARCHIVE_FILE).read_text()) == {"target": "llama-a"}
    with pytest.raises(ValueError, match="--archive"):
        archive.check_target("llama-b")


def test_a_new_output_rebuilds_the_archived_corpus_instead_of_answering_again(tmp_path):
    """Run 1 answers and archives; run 2, into an empty --output, restores every answer and
    instruction with features equal to run 1's (prefill against token-by-token generation) and
    generates nothing new."""
    from specexec.cli import main

    model_dir = save_tiny_model_dir(tmp_path / "tiny")
    archive = tmp_path / "archive"

    def corpus_only(out: str) -> None:
        argv = ["train-eagle3", "--output", str(tmp_path / out), "--model", model_dir, "--corpus-only"]
        argv += ["--archive", str(archive), "--num-prompts", "4", "--max-new-tokens", "8"]
        argv += ["--self-instruct", "3", "--corpus-minutes", "0.3"]
        assert main(argv) == 0

    corpus_only("first")
    first = read_corpus(tmp_path / "first" / "corpus" / "corpus.jsonl")
    assert len(first) >= 4 and len(CorpusArchive(archive).answers()) == len(first)
    shards = sorted(p.name for p in archive.iterdir())
    corpus_only("second")
    second = read_corpus(tmp_path / "second" / "corpus" / "corpus.jsonl")
    assert sorted(p.name for p in archive.iterdir()) == shards, "the second run archived new answers"
    by_id = {r["id"]: r for r in second}
    assert by_id.keys() == {r["id"] for r in first}
    for r in first:
        again = by_id[r["id"]]
        assert again["prompt_token_ids"] == r["prompt_token_ids"]
        assert again["output_token_ids"] == r["output_token_ids"]
        rows = torch.load(tmp_path / "first" / "corpus" / r["features"]).float()
        rebuilt = torch.load(tmp_path / "second" / "corpus" / again["features"]).float()
        assert rebuilt.shape == rows.shape
        torch.testing.assert_close(rebuilt, rows, rtol=0.03, atol=0.03)
    pool = (tmp_path / "second" / "corpus" / "prompt_pool.jsonl").read_text()
    assert pool == (tmp_path / "first" / "corpus" / "prompt_pool.jsonl").read_text()


def test_the_bundled_archive_is_the_default_models_only(tmp_path, monkeypatch):
    from argparse import Namespace

    from specexec.drafters.training import archive as training_archive

    monkeypatch.setattr(training_archive, "BUNDLED_ARCHIVE", tmp_path / "bundled")
    _, model = make_tiny_model("llama", dtype=torch.float32)

    def opened(model_arg, archive_arg):
        found = training_archive.open_archive(Namespace(model=model_arg, archive=archive_arg), model)
        return None if found is None else found.root

    assert opened(None, None) == tmp_path / "bundled"
    assert opened("my/model", None) is None
    assert opened(None, "none") is None
    assert opened("my/model", str(tmp_path / "mine")) == tmp_path / "mine"
    assert json.loads((tmp_path / "mine" / ARCHIVE_FILE).read_text())["target"] == target_fingerprint(model)
