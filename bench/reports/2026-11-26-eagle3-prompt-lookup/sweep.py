"""Acceptance length of the shipped EAGLE-3 head with prompt lookup under several rules, greedy, k=3,
batch 1, 128 tokens, on Spec-Bench and the extraction set (acceptance only: the runs are sequential,
so their tokens/s are not comparable; `eagle3_eval --with-lookup` gives speed-ups side by side).

    python bench/reports/2026-11-26-eagle3-prompt-lookup/sweep.py --num-requests 24 \\
        --rules '[null, [2, 0.5], [1, 0.5], [2, 0.3], [2, 0.8]]'             # sweep.txt
    python bench/reports/2026-11-26-eagle3-prompt-lookup/sweep.py --num-requests 24 --skip 24 \\
        --rules '[null, [2, 0.5]]'                                          # fresh_half.txt

A rule is [lookup_min_match, lookup_below_confidence]; null is the head alone. ``--skip N`` takes the
draws after the first N of each set's spread order (held out from training like the first: every draw
of up to 64 is), so a rule chosen on the first 24 is checked on 24 it was not chosen on.
"""

import argparse
import json

from specexec.bench.engines.specexec_hf import Workload, chat_token_ids, run_specexec
from specexec.bench.records import summarize
from specexec.executor.config import ExecutorConfig
from specexec.executor.executor import Executor
from specexec.prompt_sets.datasets import load_dataset

parser = argparse.ArgumentParser()
parser.add_argument("--num-requests", type=int, default=24)
parser.add_argument("--skip", type=int, default=0)
parser.add_argument("--rules", default="[null, [2, 0.5]]")
args = parser.parse_args()
rules = json.loads(args.rules)

spec = {"decoding_type": "Eagle", "max_draft_len": 3, "prompt_lookup": True}
executor = Executor(config=ExecutorConfig(speculative_config=spec, progress=False, warmup=True))
drafter = executor.speculation.drafter
lookup = drafter.lookup
tokenizer = executor.tokenizer
for name in ("specbench", "extraction"):
    prompts = load_dataset(name, args.skip + args.num_requests)[args.skip :]
    ids = chat_token_ids(tokenizer, prompts)
    work = Workload(prompts, ids, 128, 0.0)
    plain = None
    for rule in rules:
        drafter.lookup = None if rule is None else lookup
        if rule is not None:
            drafter.lookup_min_match, drafter.lookup_below_confidence = rule
        records, wall = run_specexec(executor, work, 1)
        row = summarize(str(rule), 1, records, wall)
        per_position = [round(a, 2) for a in row["acceptance_per_position"]]
        print(
            f"{name} {rule} acc.len {row['mean_acceptance_length']:.3f} per position {per_position}",
            flush=True,
        )
        texts = [r.text for r in records]
        if plain is None:
            plain = texts
        else:
            print(
                f"  outputs equal to the head alone's: {sum(a == b for a, b in zip(plain, texts))}/{len(texts)}"
            )
