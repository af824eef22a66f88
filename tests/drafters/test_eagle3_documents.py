"""Document tasks for the EAGLE-3 corpus: summaries and RAG questions over the target's earlier answers,
never a held-out extraction document, and answer prompts that a grown archive only adds after the old ones."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest
from specexec.drafters.eagle3.training import train as eagle3_train
from specexec.drafters.eagle3.training.documents import (
    DISTRACTORS,
    EXTRACTION_EVERY,
    MIN_DOCUMENT_TOKENS,
    SUMMARY_PREFIX,
    document_prompts,
)
from specexec.drafters.eagle3.training.prompts import benchmark_hashes, mix_prompts, normalized_hash
from specexec.drafters.training.bundled_prompts import bench_prompt_ids
from specexec.prompt_sets.datasets import extraction_documents


def decode(ids: list[int]) -> str:
    """Each answer's first token names it, so every document's text is distinct."""
    return f"Answer text {ids[0]}: " + "word " * (len(ids) - 1)


def archive_and_pool(n: int) -> tuple[list[dict], list[dict]]:
    answers, pool = [], []
    for i in range(n):
        pool.append({"id": f"si-{i}", "prompt": f"Question number {i}?"})
        length = MIN_DOCUMENT_TOKENS if i % 5 else MIN_DOCUMENT_TOKENS - 1  # every fifth is too short
        answers.append(
            {"id": f"si-{i}", "prompt_token_ids": [1], "output_token_ids": [i] + [7] * (length - 1)}
        )
        answers.append({"id": f"si-{i}~s", "prompt_token_ids": [1], "output_token_ids": [i] * length})
    answers.append({"id": "specbench/3", "prompt_token_ids": [1], "output_token_ids": [9] * 200})
    return answers, pool


def test_summaries_and_rag_questions_come_from_greedy_pool_answers_long_enough():
    answers, pool = archive_and_pool(20)
    held_out = bench_prompt_ids("extraction")
    prompts = document_prompts(answers, pool, decode, held_out)
    from_answers = [p for p in prompts if "/si-" in p.id]
    long_enough = [f"si-{i}" for i in range(20) if i % 5]
    assert [p.id for p in from_answers if p.id.startswith("doc-sum/")] == [
        f"doc-sum/{a}" for a in long_enough
    ]
    assert [p.id for p in from_answers if p.id.startswith("doc-rag/")] == [
        f"doc-rag/{a}" for a in long_enough[DISTRACTORS:]
    ]
    by_id = {p.id: p.messages[0]["content"] for p in prompts}
    assert by_id["doc-sum/si-1"] == SUMMARY_PREFIX + decode([1] + [7] * (MIN_DOCUMENT_TOKENS - 1)).strip()
    for answer_id in long_enough[DISTRACTORS:]:
        rag = by_id[f"doc-rag/{answer_id}"]
        number = int(answer_id.split("-")[1])
        assert rag.endswith(f"\nQuestion number {number}?")
        cited = [int(line.split(":")[0].split()[-1]) for line in rag.split("\n")[:-1]]
        assert number in cited and len(set(cited)) == DISTRACTORS + 1
        assert all(c <= number and c % 5 for c in cited)  # only earlier passages, never a short answer


def test_extraction_documents_outside_every_benchmark_draw_are_summarized_in_turn():
    answers, pool = archive_and_pool(40)
    held_out = bench_prompt_ids("extraction")
    prompts = document_prompts(answers, pool, decode, held_out)
    extraction = [p for p in prompts if "/si-" not in p.id]
    documents = extraction_documents()
    expected = [f"doc-sum/{d}" for d in documents if d not in held_out]
    assert [p.id for p in extraction] == expected and held_out and len(expected) < len(documents)
    assert all(p.messages[0]["content"] == SUMMARY_PREFIX + documents[p.id[8:]] for p in extraction)
    positions = [i for i, p in enumerate(prompts) if "/si-" not in p.id]
    assert positions[:2] == [0, EXTRACTION_EVERY + 1]  # spread among the answer prompts while they last
    forbidden = benchmark_hashes()
    assert not any(normalized_hash(p.messages[0]["content"]) in forbidden for p in prompts)


def test_a_grown_archive_only_appends_prompts():
    answers, pool = archive_and_pool(30)
    held_out = bench_prompt_ids("extraction")
    before = [p for p in document_prompts(answers[:30], pool, decode, held_out) if "/si-" in p.id]
    after = [p for p in document_prompts(answers, pool, decode, held_out) if "/si-" in p.id]
    assert len(after) > len(before)
    assert after[: len(before)] == before


def test_document_tasks_and_pool_prompts_are_taken_in_turn_as_training_mixes_them():
    assert mix_prompts(["a", "b"], [1, 2, 3, 4], 0.5) == [1, "a", 2, "b", 3, 4]
    assert mix_prompts(["a"], [], 0.5) == ["a"]


def test_train_takes_the_first_document_tasks_from_the_corpus_without_an_archive(tmp_path):
    class Tokenizer:
        def decode(self, ids, skip_special_tokens=False):
            assert skip_special_tokens
            return decode(ids)

    answers, pool = archive_and_pool(10)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(a) + "\n" for a in answers))
    every = document_prompts(answers, pool, decode, bench_prompt_ids("extraction"))
    taken = eagle3_train._document_prompts(Namespace(document_tasks=5), None, pool, Tokenizer(), corpus)
    assert taken == every[:5]
    assert eagle3_train._document_prompts(Namespace(document_tasks=0), None, pool, Tokenizer(), corpus) == []
    with pytest.raises(ValueError, match="tokenizer"):
        eagle3_train._document_prompts(Namespace(document_tasks=5), None, pool, None, corpus)
