"""NGram with its lookup patched to draft only from keys of at least MIN tokens (the shorter keys'
matches dropped), on Spec-Bench's 8 prompts one at a time at the GGUF's codes: tok/s and how many drafts
were proposed and accepted (after one untimed request; the counts include it).

    python bench/reports/2026-11-28-one-group/ngram_min_key.py MIN [K] [public|private]
"""

from __future__ import annotations

import sys
import time

from specexec import Executor, ExecutorConfig
from specexec.drafters import ngram
from specexec.executor.engine.request import Request
from specexec.prompt_sets.datasets import load_dataset
from specexec.sampling import SamplingParams

min_key = int(sys.argv[1])
k = int(sys.argv[2]) if len(sys.argv) > 2 else 3
public = (sys.argv[3] if len(sys.argv) > 3 else "private") == "public"
best_match = ngram.NGramDrafter._best_match


def longer_keys_only(self, tokens, pool):
    n, continuation = best_match(self, tokens, pool)
    return (n, continuation) if n >= min_key else (0, ())


ngram.NGramDrafter._best_match = longer_keys_only
spec = {"decoding_type": "NGram", "max_draft_len": k, "is_public_pool": public}
executor = Executor(config=ExecutorConfig(quantization="gguf", speculative_config=spec, progress=False))
prompts = [
    list(
        executor.tokenizer.apply_chat_template(
            p.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    for p in load_dataset("specbench", 8)
]
params = SamplingParams(max_tokens=128, ignore_eos=True)
executor.run([Request(prompts[0], params)])
start = time.perf_counter()
for ids in prompts:
    executor.run([Request(ids, params)])
wall = time.perf_counter() - start
stats = executor.speculation.stats
tokens = 8 * 128 + 128  # with the untimed request
accepted = tokens - stats.num_target_forwards
print(
    f"keys of {min_key}+ tokens, k={k}, {'shared' if public else 'private'} pool: {8 * 128 / wall:.1f} tok/s;"
    f" {stats.num_draft_tokens} drafts in {stats.num_draft_steps} steps, {accepted} accepted"
)
