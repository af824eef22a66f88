"""The head evaluation's two rules: no evaluation prompt may be in the new head's corpus or pool, and a
head ships only when it is better on every set."""

from __future__ import annotations

import json

import pytest
import torch
from specexec.bench.eagle3_eval import check_held_out, ids_hash, is_better
from specexec.bench.engines.specexec_hf import Workload
from specexec.drafters.eagle3.training.prompts import normalized_hash
from specexec.prompt_sets.datasets import BenchPrompt


def write_corpus(head_dir, prompt_ids: list[list[int]], pool_texts: list[str]) -> None:
    corpus = head_dir / "corpus"
    corpus.mkdir(parents=True)
    with (corpus / "corpus.jsonl").open("w") as f:
        for i, ids in enumerate(prompt_ids):
            f.write(json.dumps({"id": f"c{i}", "prompt_token_ids": ids, "output_token_ids": [1]}) + "\n")
    with (corpus / "prompt_pool.jsonl").open("w") as f:
        for i, text in enumerate(pool_texts):
            f.write(
                json.dumps({"id": f"si-{i}", "prompt": text, "hash": normalized_hash(text), "seed": i}) + "\n"
            )


def workload(texts_and_ids) -> Workload:
    prompts = [
        BenchPrompt(f"p{i}", [{"role": "user", "content": t}]) for i, (t, _) in enumerate(texts_and_ids)
    ]
    return Workload(prompts, [ids for _, ids in texts_and_ids], 8, 0.0)


def test_an_evaluation_prompt_in_the_corpus_or_the_pool_stops_the_evaluation(tmp_path):
    write_corpus(tmp_path, [[1, 2, 3]], ["Plan a trip to Rome."])
    clean = {"set": workload([("Explain tides.", [4, 5, 6])])}
    held = {"prompts": 1, "corpus_sequences": 1, "archive_answers": 0, "pool_instructions": 1}
    assert check_held_out(tmp_path, clean) == held
    with pytest.raises(ValueError, match="not held out"):
        check_held_out(tmp_path, {"set": workload([("Something else.", [1, 2, 3])])})
    with pytest.raises(ValueError, match="not held out"):
        check_held_out(tmp_path, {"set": workload([("plan a TRIP to rome", [9, 9])])})
    assert ids_hash([1, 2, 3]) != ids_hash([1, 2, 3, 4])


def test_a_head_without_its_corpus_is_checked_against_the_token_archive(tmp_path):
    """A head trained elsewhere comes without ``corpus/``: the archive of what it was trained on
    still stops an evaluation prompt that is in it."""
    from specexec.drafters.training.archive import CorpusArchive

    archive = CorpusArchive(tmp_path / "archive")
    pool = [{"id": "si-0", "prompt": "Plan a trip to Rome.", "hash": normalized_hash("Plan a trip to Rome.")}]
    archive.export([{"id": "a0", "prompt_token_ids": [1, 2, 3], "output_token_ids": [4]}], pool)
    head = tmp_path / "head"  # no corpus beside it
    clean = {"set": workload([("Explain tides.", [4, 5, 6])])}
    held = check_held_out(head, clean, archive.root)
    assert held == {"prompts": 1, "corpus_sequences": 0, "archive_answers": 1, "pool_instructions": 1}
    with pytest.raises(ValueError, match="not held out"):
        check_held_out(head, {"set": workload([("Something else.", [1, 2, 3])])}, archive.root)
    with pytest.raises(ValueError, match="not held out"):
        check_held_out(head, {"set": workload([("plan a TRIP to rome", [9, 9])])}, archive.root)


def test_a_head_ships_only_when_better_on_every_set():
    def sets(*pairs):
        return {
            f"s{i}": {
                "current": {"acceptance_length": 2.0, "speedup": 1.0},
                "new": {"acceptance_length": acc, "speedup": speed},
            }
            for i, (acc, speed) in enumerate(pairs)
        }

    assert is_better(sets((2.5, 1.2), (2.1, 1.05)))
    assert not is_better(sets((2.5, 1.2), (2.1, 0.99)))  # slower on one set
    assert not is_better(sets((2.0, 1.3)))  # the same acceptance length is not better
    assert not is_better(sets((None, 1.3)))


def test_the_report_names_the_machine_dtype_and_linear_kernels():
    from factories import drafting_config
    from specexec.bench.eagle3_eval import format_report, machine_line
    from specexec.executor.executor import Executor
    from tiny_models import make_tiny_model

    _, model = make_tiny_model("llama", dtype=torch.float32)
    with Executor(model, drafting_config(dtype="float32", cpu_linear="blas")) as executor:
        line = machine_line(executor)
    assert "threads, float32, cpu_linear blas (configured)" in line
    report = {"machine": line, "held_out": {"prompts": 0, "corpus_sequences": 0, "pool_instructions": 0},
              "sets": {}, "head_forward_cost": {"current": 0.1, "new": 0.1}, "new_is_better": False}  # fmt: skip
    assert format_report(report).splitlines()[0] == f"machine: {line}"


def test_engines_take_turns_prompt_by_prompt_and_each_row_sums_its_own_runs(monkeypatch):
    from specexec.bench import eagle3_eval
    from specexec.bench.records import RequestRecord

    calls = []

    def fake_run(executor, work, concurrency):
        assert concurrency == 1 and len(work.prompts) == 1
        calls.append((executor, work.prompts[0].id))
        tokens = {"none": 10, "a": 20, "b": 30}[executor]
        return [RequestRecord(work.prompts[0].id, len(work.token_ids[0]), tokens, 1.0)], 0.5

    monkeypatch.setattr(eagle3_eval, "run_specexec", fake_run)
    work = workload([(f"prompt {i}", [i, i + 1]) for i in range(4)])
    rows = eagle3_eval.run_interleaved({"none": "none", "a": "a", "b": "b"}, work)
    assert [c[1] for c in calls] == [p for p in ("p0", "p1", "p2", "p3") for _ in range(3)]
    assert [c[0] for c in calls[:6]] == ["none", "a", "b", "a", "b", "none"]
    for label, tokens in (("none", 10), ("a", 20), ("b", 30)):
        assert [r for r in calls if r[0] == label] == [(label, f"p{i}") for i in range(4)]
        assert rows[label]["num_requests"] == 4 and rows[label]["wall_s"] == 2.0
        assert rows[label]["output_tokens_per_s"] == 4 * tokens / 2.0


def test_a_report_of_the_current_head_alone_makes_no_shipping_claim():
    from specexec.bench.eagle3_eval import format_report

    row = {"acceptance_length": 1.9, "acceptance_per_position": [0.5], "tokens_per_s": 30.0, "speedup": 1.2}
    report = {"held_out": {"prompts": 2, "corpus_sequences": 0, "pool_instructions": 0},
              "sets": {"specbench": {"current": row, "cur+look": row}},
              "head_forward_cost": {"current": 0.04}, "new_is_better": None}  # fmt: skip
    text = format_report(report)
    assert "cur+look" in text and "current 0.04" in text
    assert "new" not in text.replace("none", "")
