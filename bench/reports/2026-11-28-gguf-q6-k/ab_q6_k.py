"""Q6_K at its codes against Q6_K dense, the same Q4_K_M file, in one process, taking turns (5 rounds):
a 200-token prefill and a 64-token decode each. Run from the repository root: python bench/reports/2026-11-28-gguf-q6-k/ab_q6_k.py"""

import statistics
import time

from specexec import Executor, ExecutorConfig
from specexec.executor.engine.request import Request
from specexec.executor.layers.quantized import quantization
from specexec.sampling import SamplingParams

f = "/opt/gguf/smollm2-135m-instruct-q4_k_m.gguf"
codes = Executor(config=ExecutorConfig(model=f, quantization="gguf", progress=False))
quantization.INT8_BLOCK_TYPES = ("Q8_0", "Q5_0")
dense = Executor(config=ExecutorConfig(model=f, quantization="gguf", progress=False))
print(codes.quantization.summary())
print(dense.quantization.summary())
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
