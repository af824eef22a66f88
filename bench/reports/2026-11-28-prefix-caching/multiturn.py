"""Multi-turn chat with and without prefix caching, side by side in one process.

    python bench/reports/2026-11-28-prefix-caching/multiturn.py [--conversations 8] [--turns 5]
        [--max-tokens 64] [--drafter none|ngram] [--rounds 2] [--dtype auto] [--quantization gguf|none]
        [--output multiturn.json]

Each conversation takes ``--turns`` Spec-Bench prompts in turn (its first the conversation's own, the
rest the next ones in the set); every turn appends the model's own answer and the next prompt, so turn
t's prompt is the whole conversation so far. The embedded SmolLM2 (its GGUF codes, or dense with
``--quantization none``; `dtype: auto` unless ``--dtype``), greedy, one
conversation at a time (concurrency 1). Two executors, prefix caching off and on, take turns
conversation by conversation (``--rounds`` passes; medians). Printed: the median TTFT of turns 1 and
2-5, total output tok/s, the prompt tokens reused, and whether every answer was the same with and
without caching.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from specexec import Executor, ExecutorConfig, Request, SamplingParams
from specexec.executor.layers.cpu_info import describe_cpu
from specexec.prompt_sets.datasets import load_dataset


def conversation(
    executor: Executor, questions: list[str], max_tokens: int
) -> tuple[list[float], int, float, list[str], int]:
    """(TTFT per turn, output tokens, seconds, answers, cached prompt tokens)."""
    messages, ttfts, answers, tokens, cached = [], [], [], 0, 0
    start = time.perf_counter()
    for question in questions:
        messages.append({"role": "user", "content": question})
        (out,) = executor.run([Request(list(messages), SamplingParams(max_tokens=max_tokens))])
        ttfts.append(out.metrics.time_to_first_token)
        answers.append(out.text)
        tokens += out.metrics.num_output_tokens
        cached += out.metrics.num_cached_tokens
        messages.append({"role": "assistant", "content": out.text})
    return ttfts, tokens, time.perf_counter() - start, answers, cached


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--drafter", default="none", choices=["none", "ngram"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="auto", help="the executors' dtype (auto: measured per CPU)")
    parser.add_argument(
        "--quantization", default="gguf", choices=["gguf", "none"], help="none: dense weights"
    )
    parser.add_argument("--output")
    args = parser.parse_args()
    questions = [p.messages[-1]["content"] for p in load_dataset("specbench")]
    spec = {"decoding_type": "NGram", "max_draft_len": 3} if args.drafter == "ngram" else None
    executors = {
        cache: Executor(
            None,
            ExecutorConfig(
                quantization=None if args.quantization == "none" else args.quantization,
                dtype=args.dtype,
                speculative_config=spec,
                enable_prefix_caching=cache,
                progress=False,
            ),
        )
        for cache in (False, True)
    }
    results = {
        cache: {"first": [], "later": [], "tokens": 0, "seconds": 0.0, "cached": 0, "answers": []}
        for cache in executors
    }
    for round_ in range(args.rounds):
        for c in range(args.conversations):
            turns = [questions[(c * args.turns + t) % len(questions)] for t in range(args.turns)]
            for cache, executor in executors.items():
                ttfts, tokens, seconds, answers, cached = conversation(executor, turns, args.max_tokens)
                r = results[cache]
                r["first"].append(ttfts[0])
                r["later"] += ttfts[1:]
                r["tokens"] += tokens
                r["seconds"] += seconds
                r["cached"] += cached
                if round_ == 0:
                    r["answers"].append(answers)
    print(
        f"{describe_cpu()}; {args.conversations} conversations x {args.turns} turns, {args.max_tokens} tokens, drafter {args.drafter}"
    )
    rows = {}
    for cache, r in results.items():
        rows[cache] = {
            "ttft_first_ms": 1e3 * statistics.median(r["first"]),
            "ttft_later_ms": 1e3 * statistics.median(r["later"]),
            "tok_s": r["tokens"] / r["seconds"],
            "cached_tokens": r["cached"],
        }
        print(
            f"prefix caching {'on ' if cache else 'off'}: "
            + ", ".join(f"{k} {v:.1f}" for k, v in rows[cache].items())
        )
    same = results[True]["answers"] == results[False]["answers"]
    pairs = list(zip(results[True]["answers"], results[False]["answers"]))
    # a turn compares like with like only while the conversation has not diverged before it
    first_turns = sum(a[0] == b[0] for a, b in pairs)
    whole = sum(a == b for a, b in pairs)
    print(
        f"on/off: TTFT of turns 2-{args.turns} {rows[True]['ttft_later_ms'] / rows[False]['ttft_later_ms']:.2f}x, "
        f"tok/s {rows[True]['tok_s'] / rows[False]['tok_s']:.2f}x; answers the same: {same} "
        f"(first turns {first_turns}/{len(pairs)}, whole conversations {whole}/{len(pairs)})"
    )
    if args.output:
        with open(args.output, "w") as f:
            json.dump(
                {
                    "cpu": describe_cpu(),
                    "args": vars(args),
                    "rows": {str(k): v for k, v in rows.items()},
                    "same": same,
                },
                f,
                indent=1,
            )
    for executor in executors.values():
        executor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
