"""A prompt pool for the EAGLE-3 corpus that scales and that no benchmark can draw from: instructions the
target writes itself (self-instruct, Wang et al. arXiv 2212.10560) from seed task types and topics.

Each request asks the target for one new instruction of a given task type about a given topic,
sampled (temperature 0.9, its own seed), so the pool grows with the number of (type, topic, seed)
triples. An instruction is kept when it is a plausible request (length, no meta-text), when its
normalized text is new (exact duplicates and near-duplicates by a normalized hash), and when its hash
is not the hash of any bundled benchmark prompt. The pool is appended to a JSONL file one instruction
at a time, so a rerun continues it. `mix_prompts` gives the pool its share (``--pool-share``) of the
corpus's prompt order.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ....prompt_sets.datasets import BenchPrompt
from ...training.jsonl import open_for_append, read_jsonl

TASK_TYPES = (
    "explain a concept simply",
    "write a short story",
    "write a poem",
    "give step-by-step instructions",
    "compare two things",
    "list pros and cons",
    "answer a factual question",
    "solve a math word problem",
    "write a Python function",
    "fix or explain a piece of code",
    "write an email",
    "summarize a situation",
    "give advice",
    "brainstorm ideas",
    "plan a schedule",
    "role-play a character",
    "rewrite a sentence in another style",
    "translate a sentence",
    "describe a place",
    "argue for an opinion",
    "extract details as JSON",
    "write a product description",
    "classify items",
    "write a dialogue",
)
TOPICS = (
    "cooking",
    "space",
    "history",
    "personal finance",
    "health",
    "travel",
    "sports",
    "music",
    "gardening",
    "climate",
    "programming",
    "databases",
    "law",
    "school",
    "pets",
    "cars",
    "movies",
    "physics",
    "chemistry",
    "biology",
    "geography",
    "art",
    "photography",
    "careers",
    "friendship",
    "the ocean",
    "trains",
    "weather",
    "mathematics",
    "board games",
    "fashion",
    "architecture",
)
#: hand-written examples (none from a benchmark), shown before each new request: a 135M model asked
#: for "a request" in chat answers as an assistant; continuing a numbered list it writes requests
SEED_EXAMPLES = (
    ("explain a concept simply", "gardening", "Explain why tomato plants need to be staked as they grow."),
    ("write a poem", "trains", "Write a four-line poem about a night train crossing a snowy valley."),
    ("compare two things", "personal finance", "Compare renting and buying a home for a young family."),
    ("write a Python function", "programming", "Write a Python function that counts the vowels in a string."),
    ("give advice", "careers", "How should I prepare for my first job interview at a bank?"),
    ("plan a schedule", "school", "Make a one-week study plan for a chemistry exam on Friday."),
)
INSTRUCTION_PROMPT = (
    "Requests that users sent to an AI assistant, each with its kind of task and topic:\n"
    + "".join(f"{i + 1}. ({task}; {topic}) {text}\n" for i, (task, topic, text) in enumerate(SEED_EXAMPLES))
    + f"{len(SEED_EXAMPLES) + 1}. ({{task}}; {{topic}})"
)
MIN_CHARS, MAX_CHARS = 20, 400
_META = re.compile(r"^(sure|here is|here's|request:|user:|assistant:|as an ai)", re.IGNORECASE)


def normalized_hash(text: str) -> str:
    """The hash two prompts share when they differ only in case, punctuation and spacing."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return hashlib.sha256(" ".join(words).encode()).hexdigest()[:20]


def benchmark_hashes() -> set[str]:
    """The normalized hash of every bundled benchmark prompt (every dataset, held out or not)."""
    from ....prompt_sets.datasets import JSONSCHEMABENCH_SPLITS, load_dataset

    names = [
        "specbench",
        "extraction",
        "bfcl",
        "humaneval",
        *(f"jsonschemabench:{s}" for s in JSONSCHEMABENCH_SPLITS),
    ]
    return {normalized_hash(m["content"]) for name in names for p in load_dataset(name) for m in p.messages}


def clean_instruction(text: str) -> str | None:
    """The instruction in a generated reply, or None when the reply is not one."""
    text = text.strip().split("\n\n")[0].strip()
    text = text.strip('"').strip("'").strip()
    if not MIN_CHARS <= len(text) <= MAX_CHARS or _META.match(text):
        return None
    return text


def seeds(start: int = 0) -> Iterator[tuple[int, str, str]]:
    """(seed, task type, topic), cycling through every pair before reusing one with a new seed."""
    i = start
    pairs = [(task, topic) for topic in TOPICS for task in TASK_TYPES]
    while True:
        task, topic = pairs[i % len(pairs)]
        yield i, task, topic
        i += 1


def read_pool(path: Path) -> list[dict]:
    """``{"id", "prompt", "hash", "seed", "task", "topic"}`` records (a torn last line is skipped)."""
    return read_jsonl(path)


def grow_pool(
    path: Path,
    generate: Callable[[list[tuple[int, str, str]]], Iterable[tuple[int, str]]],
    target_size: int,
    *,
    max_seconds: float | None = None,
    batch: int = 64,
    forbidden: set[str] | None = None,
) -> dict:
    """Append instructions to ``path`` until it holds ``target_size`` (or ``max_seconds`` pass).
    ``generate(triples)`` yields ``(seed, reply)`` for (seed, task, topic) triples. Returns counts:
    kept, and dropped as malformed, duplicate or benchmark prompts."""
    pool = read_pool(path)
    seen = {r["hash"] for r in pool} | {normalized_hash(text) for _, _, text in SEED_EXAMPLES}
    forbidden = benchmark_hashes() if forbidden is None else forbidden
    next_seed = max((r["seed"] for r in pool), default=-1) + 1
    meta = {}
    counts = {"kept": 0, "malformed": 0, "duplicate": 0, "benchmark": 0}
    start = time.perf_counter()
    source = seeds(next_seed)
    with open_for_append(path) as f:
        while len(pool) < target_size and (max_seconds is None or time.perf_counter() - start < max_seconds):
            triples = [next(source) for _ in range(batch)]
            meta.update({s: (task, topic) for s, task, topic in triples})
            for seed, reply in generate(triples):
                text = clean_instruction(reply)
                digest = normalized_hash(text) if text else None
                if text is None:
                    counts["malformed"] += 1
                elif digest in forbidden:
                    counts["benchmark"] += 1
                elif digest in seen:
                    counts["duplicate"] += 1
                else:
                    seen.add(digest)
                    task, topic = meta[seed]
                    record = {
                        "id": f"si-{seed}",
                        "prompt": text,
                        "hash": digest,
                        "seed": seed,
                        "task": task,
                        "topic": topic,
                    }
                    f.write(json.dumps(record) + "\n")
                    f.flush()
                    pool.append(record)
                    counts["kept"] += 1
                    if len(pool) >= target_size:
                        break
    counts["pool_size"] = len(pool)
    return counts


def executor_generator(executor, max_tokens: int = 80):
    """``generate`` for `grow_pool` from a loaded executor: each triple's numbered-list continuation (a
    plain-text prompt, no chat template), sampled at temperature 0.9 with the triple's seed, all in one
    batch; the reply is its first line."""
    from ....executor.engine.request import Request
    from ....sampling import SamplingParams

    def generate(triples):
        requests = [
            Request(
                INSTRUCTION_PROMPT.format(task=task, topic=topic),
                SamplingParams(max_tokens=max_tokens, temperature=0.9, top_p=0.95, seed=seed, stop=["\n"]),
                request_id=f"si-{seed}",
            )
            for seed, task, topic in triples
        ]
        for (seed, _, _), out in zip(triples, executor.run(requests)):
            if out.error is None:
                yield seed, out.text

    return generate


def pool_prompts(pool: list[dict]) -> list[BenchPrompt]:
    """The self-instruct pool's instructions (`grow_pool`) as chat prompts."""
    return [BenchPrompt(r["id"], [{"role": "user", "content": r["prompt"]}]) for r in pool]


def mix_prompts(bundled: list[BenchPrompt], pool: list[BenchPrompt], pool_share: float) -> list[BenchPrompt]:
    """Both lists in one order where every prefix takes about ``pool_share`` of its prompts from the
    pool (while both last), so a time-limited run reaches the pool's open chat instead of answering
    every bundled prompt first; each list keeps its own order, and a rerun skips what is answered."""
    if not 0.0 <= pool_share <= 1.0:
        raise ValueError(f"the pool's share of the prompts must be in 0..1, got {pool_share}")
    mixed: list[BenchPrompt] = []
    i = j = 0
    while i < len(bundled) or j < len(pool):
        take_pool = j < len(pool) and (i >= len(bundled) or j < pool_share * (i + j + 1))
        if take_pool:
            mixed.append(pool[j])
            j += 1
        else:
            mixed.append(bundled[i])
            i += 1
    return mixed
