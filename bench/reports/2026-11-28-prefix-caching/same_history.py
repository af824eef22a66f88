"""Prefix caching off and on fed the same history: do the answers and log-probabilities agree?

    python bench/reports/2026-11-28-prefix-caching/same_history.py [--dtype float32] [--quantization none]

The multi-turn conversations of `multiturn.py` (8 x 5 turns, 64 tokens, greedy), but each turn's prompt
is built from the cache-off executor's answers and given to both, so every turn compares like with
like. Prints, per conversation, the turns whose tokens differ and the largest log-probability
difference before any difference in tokens.
"""

from __future__ import annotations

import argparse

from specexec import Executor, ExecutorConfig, Request, SamplingParams
from specexec.prompt_sets.datasets import load_dataset

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--dtype", default="float32")
parser.add_argument("--quantization", default="none", choices=["none", "gguf"])
args = parser.parse_args()
questions = [p.messages[-1]["content"] for p in load_dataset("specbench")]
quantization = None if args.quantization == "none" else args.quantization
on, off = (
    Executor(
        None,
        ExecutorConfig(dtype=args.dtype, quantization=quantization, enable_prefix_caching=c, progress=False),
    )
    for c in (True, False)
)
params = SamplingParams(max_tokens=64, logprobs=0)
worst = 0.0
for c in range(8):
    messages, differing, largest = [], [], 0.0
    for t in range(5):
        messages.append({"role": "user", "content": questions[(c * 5 + t) % len(questions)]})
        (a,) = off.run([Request(list(messages), params)])
        (b,) = on.run([Request(list(messages), params)])
        first = next(
            (j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), len(a.token_ids)
        )
        if first < len(a.token_ids) or a.token_ids != b.token_ids:
            differing.append(t)
        largest = max(
            [largest] + [abs(x.logprob - y.logprob) for x, y in zip(a.logprobs[:first], b.logprobs[:first])]
        )
        messages.append({"role": "assistant", "content": a.text})
    worst = max(worst, largest)
    print(
        f"conversation {c}: turns with other tokens {differing}; largest log-probability difference {largest:.1e}"
    )
print(f"{args.dtype}, {args.quantization}: largest difference {worst:.1e}")
