"""Q5_1 and Q5_K at their codes against the same tensors dense, on a Q5_K_M file of the default model
(made by `make_q5_k_m.sh`), in one process, taking turns (5 rounds): a 200-token prefill and a 64-token
decode each; the weights' bytes; and the greedy tokens of both on chat prompts.
Run from the repository root: python bench/reports/2026-11-29-gguf-q5/ab_q5.py [file]"""

import statistics
import sys
import time

from specexec import Executor, ExecutorConfig
from specexec.executor.engine.request import Request
from specexec.executor.layers.quantized import quantization
from specexec.sampling import SamplingParams

path = sys.argv[1] if len(sys.argv) > 1 else "/opt/gguf/smollm2-135m-instruct-q5_k_m.gguf"
codes = Executor(config=ExecutorConfig(model=path, quantization="gguf", progress=False))
quantization.INT8_BLOCK_TYPES = ("Q8_0", "Q5_0", "Q6_K")  # as before: Q5_1 and Q5_K dense
dense = Executor(config=ExecutorConfig(model=path, quantization="gguf", progress=False))
for name, ex in (("codes", codes), ("dense", dense)):
    print(name, ex.quantization.summary())
prompt = list(range(1000, 1200))


def prefill(ex):
    t = time.perf_counter()
    ex.run([Request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))])
    return time.perf_counter() - t


def decode(ex):
    t = time.perf_counter()
    ex.run([Request(prompt[:20], SamplingParams(max_tokens=65, ignore_eos=True))])
    return (time.perf_counter() - t) / 64


res = {(n, k): [] for n in ("codes", "dense") for k in ("prefill", "decode")}
for _ in range(5):
    for n, ex in (("codes", codes), ("dense", dense)):
        res[n, "prefill"].append(prefill(ex))
        res[n, "decode"].append(decode(ex))
for k, v in res.items():
    print(k, f"{statistics.median(v) * 1e3:.2f} ms", [round(x * 1e3, 1) for x in v])
for k in ("prefill", "decode"):
    ratio = statistics.median(res["codes", k]) / statistics.median(res["dense", k])
    print(f"{k}: codes at {ratio:.2f}x dense's time")

chats = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
]
same, total = 0, 0
for text in chats:
    ids = codes.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    ids = list(ids if isinstance(ids, list) else ids["input_ids"])
    outs = [ex.run([Request(ids, SamplingParams(max_tokens=48))])[0].token_ids for ex in (codes, dense)]
    agree = sum(a == b for a, b in zip(*outs))
    same += outs[0] == outs[1]
    total += 1
    print(
        f"greedy: {'same' if outs[0] == outs[1] else 'differs'} ({agree}/{min(map(len, outs))} tokens agree)"
    )
print(f"greedy outputs equal on {same} of {total} chat prompts")
