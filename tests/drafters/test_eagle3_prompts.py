"""The self-instruct prompt pool for the EAGLE-3 corpus: kept, malformed, duplicate and benchmark
instructions told apart; the pool resumes where it stopped; no bundled benchmark prompt gets in."""

from __future__ import annotations

from specexec.drafters.eagle3.training.prompts import (
    SEED_EXAMPLES,
    benchmark_hashes,
    clean_instruction,
    grow_pool,
    normalized_hash,
    read_pool,
)
from specexec.prompt_sets.datasets import load_dataset


def fake_generator(replies: dict[int, str]):
    """Replies by seed; seeds without one get a distinct instruction."""

    def generate(triples):
        for seed, task, topic in triples:
            yield seed, replies.get(seed, f"Tell me fact number {seed} about {topic} ({task}).")

    return generate


def test_kept_malformed_duplicate_and_benchmark_instructions_are_told_apart(tmp_path):
    bench_prompt = load_dataset("specbench")[0].messages[-1]["content"]
    replies = {
        0: "short",  # too short
        1: "Sure! Here is a request: explain tides.",  # meta-text
        2: "Explain how tides work on the coast of Brittany.",
        3: "explain how TIDES work on the coast of brittany!",  # the same, normalized
        4: bench_prompt.upper(),  # a benchmark prompt, disguised
        5: SEED_EXAMPLES[0][2],  # an example of the prompt itself
    }
    counts = grow_pool(
        tmp_path / "pool.jsonl", fake_generator(replies), 3, batch=8, forbidden=benchmark_hashes()
    )
    pool = read_pool(tmp_path / "pool.jsonl")
    assert counts == {"kept": 3, "malformed": 2, "duplicate": 2, "benchmark": 1, "pool_size": 3}
    assert [r["seed"] for r in pool] == [2, 6, 7]
    texts = [r["prompt"] for r in pool]
    assert "Explain how tides work on the coast of Brittany." in texts
    assert all(normalized_hash(t) not in benchmark_hashes() for t in texts)
    assert len({r["hash"] for r in pool}) == len(pool)


def test_the_pool_resumes_after_its_last_seed_and_skips_a_torn_line(tmp_path):
    path = tmp_path / "pool.jsonl"
    grow_pool(path, fake_generator({}), 5, batch=5, forbidden=set())
    with path.open("a") as f:
        f.write('{"id": "si-99", "prom')  # a run killed mid-write
    counts = grow_pool(path, fake_generator({}), 9, batch=4, forbidden=set())
    pool = read_pool(path)
    assert counts["pool_size"] == len(pool) == 9
    assert [r["seed"] for r in pool] == list(range(9))


def test_clean_instruction_keeps_the_first_paragraph_without_quotes():
    assert clean_instruction('  "Plan a three-day trip to Lisbon on a budget."\n\nMore text') == (
        "Plan a three-day trip to Lisbon on a budget."
    )
    assert clean_instruction("x" * 500) is None
