"""NGram k=3 on the shipped Q4_1 file, one request at a time: no drafts, fixed, and auto with its acceptance
estimates decaying at 0.7 (the default), 0.8 and 0.9, taking turns in one process (3 rounds).
    python bench/reports/2026-11-28-draft-policy-batch-cost/harness_c1.py humaneval"""

import statistics
import sys
import time

from specexec import Executor, ExecutorConfig
from specexec.executor.engine.request import Request
from specexec.prompt_sets.datasets import load_dataset
from specexec.sampling import SamplingParams

dataset = sys.argv[1]
exs = {}
for name, policy in (("none", None), ("fixed", "fixed"), ("auto", "auto")):
    spec = (
        None if policy is None else {"decoding_type": "NGram", "max_draft_len": 3, "draft_len_policy": policy}
    )
    exs[name] = Executor(config=ExecutorConfig(quantization="gguf", progress=False, speculative_config=spec))
tok = exs["none"].tokenizer
reqs = []
for p in load_dataset(dataset, 8):
    ids = tok.apply_chat_template(p.messages, add_generation_prompt=True)
    reqs.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
variants = {
    "none": ("none", None),
    "fixed": ("fixed", None),
    "auto0.7": ("auto", 0.7),
    "auto0.9": ("auto", 0.9),
    "auto0.8": ("auto", 0.8),
}
res = {v: [] for v in variants}
acc = {v: [] for v in variants}
for _round in range(3):
    for v, (name, decay) in variants.items():
        ex = exs[name]
        if decay is not None:
            ex.speculation.policy.decay = decay
        t = time.perf_counter()
        n = 0
        for ids in reqs:
            out = ex.run([Request(ids, SamplingParams(max_tokens=128, ignore_eos=True))])[0]
            n += len(out.token_ids)
            acc[v].append(out.metrics.mean_acceptance_length or 1)
        res[v].append(n / (time.perf_counter() - t))
base = statistics.median(res["none"])
for v in variants:
    print(
        v,
        f"{statistics.median(res[v]):.1f} tok/s {statistics.median(res[v]) / base:.2f}x acc {statistics.mean(acc[v]):.2f}",
        [round(x, 1) for x in res[v]],
    )
print(
    "curve",
    [
        round(s / exs["auto"].speculation.policy.cost_model.seconds[0], 2)
        for s in exs["auto"].speculation.policy.cost_model.seconds
    ],
)
