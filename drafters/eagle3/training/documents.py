"""Document tasks for the EAGLE-3 corpus: prompts whose answer draws on a document in the prompt.

Spec-Bench's summarization and RAG prompts carry a long document; the self-instruct pool's are one
short instruction each. A head trained mostly on the pool agrees with the target far less on held-out
document prompts than on the document prompts it was trained on (step 0: summarization 0.30 held out
against 0.76 seen), so it needs more of them, none from a benchmark. Here they are built from text the
corpus already has:

- ``doc-sum/<answer id>``: "Summarize: " and one of the target's own greedy answers to a pool
  instruction (at least `MIN_DOCUMENT_TOKENS` long);
- ``doc-rag/<answer id>``: that answer and `DISTRACTORS` earlier ones as passages, in an order fixed by
  the id, then the pool instruction it answered as the question;
- ``doc-sum/<extraction id>``: "Summarize: " and a document of the extraction set outside every
  benchmark draw (`drafters/training/bundled_prompts.py: bench_prompt_ids`).

Every prompt depends only on answers before it in the archive's order, so a grown archive adds answer
prompts only after the ones it had (the extraction summaries, one per `EXTRACTION_EVERY` of them, are all
placed once there are 8 x 139), and a rerun, which skips what is answered by id, continues the list.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from ....prompt_sets.datasets import BenchPrompt, extraction_documents

MIN_DOCUMENT_TOKENS = 96  #: shorter answers make poor documents
DISTRACTORS = 2  #: passages beside the one that answers a RAG question
EXTRACTION_EVERY = 8  #: one extraction-document summary before each this many answer-document prompts
SUMMARY_PREFIX = "Summarize: "


def document_prompts(
    answers: list[dict],
    pool: list[dict],
    decode: Callable[[list[int]], str],
    held_out: set[str],
) -> list[BenchPrompt]:
    """The document prompts buildable from ``answers`` (archive records in archive order) of the
    ``pool``'s instructions, interleaved: summary, RAG question, ..., an extraction-document summary
    every `EXTRACTION_EVERY` prompts while they last. ``decode`` turns token ids into text (special
    tokens dropped); ``held_out``: extraction prompt ids a benchmark draw can pick, never used."""
    questions = {r["id"]: r["prompt"] for r in pool}
    passages: list[tuple[str, str]] = []  # (answer id, text), in archive order
    for a in answers:
        if a["id"] in questions and len(a["output_token_ids"]) >= MIN_DOCUMENT_TOKENS:
            text = decode(a["output_token_ids"]).strip()
            if text:
                passages.append((a["id"], text))
    from_answers: list[BenchPrompt] = []
    for i, (answer_id, text) in enumerate(passages):
        from_answers.append(_user(f"doc-sum/{answer_id}", SUMMARY_PREFIX + text))
        if i >= DISTRACTORS:
            chosen = [text, *(passages[j][1] for j in _earlier(answer_id, i, DISTRACTORS))]
            order = sorted(range(len(chosen)), key=lambda k: _digest(f"{answer_id}/{k}"))
            body = "\n".join(chosen[k] for k in order)
            from_answers.append(_user(f"doc-rag/{answer_id}", f"{body}\n{questions[answer_id]}"))
    documents = [
        _user(f"doc-sum/{doc_id}", SUMMARY_PREFIX + text)
        for doc_id, text in extraction_documents().items()
        if doc_id not in held_out
    ]
    mixed: list[BenchPrompt] = []
    for i, prompt in enumerate(from_answers):
        if i % EXTRACTION_EVERY == 0 and documents:
            mixed.append(documents.pop(0))
        mixed.append(prompt)
    return mixed + documents


def _earlier(answer_id: str, index: int, count: int) -> list[int]:
    """``count`` distinct indices below ``index``, chosen by the answer's id (so a rerun picks the same)."""
    picks: list[int] = []
    salt = 0
    while len(picks) < count:
        j = int(_digest(f"{answer_id}#{salt}"), 16) % index
        if j not in picks:
            picks.append(j)
        salt += 1
    return picks


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _user(prompt_id: str, content: str) -> BenchPrompt:
    return BenchPrompt(prompt_id, [{"role": "user", "content": content}])
