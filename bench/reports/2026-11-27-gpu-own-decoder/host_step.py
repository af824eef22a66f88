"""The host part of a batch-1 decode step on the CPU: wall time over the target's forwards, minus the
forwards' own time (the executor's counters), for the embedded GGUF at its codes.

    python bench/reports/2026-11-27-gpu-own-decoder/host_step.py [--max-tokens 128]

Measured on the 2-core EPYC (bfloat16): 1.00-1.11 ms before `rejection_sample`'s short greedy path and its
single `torch.max` pass, 0.77-0.88 ms after (one run each, this host drifts).
"""

from __future__ import annotations

import argparse
import time

from specexec import Executor, ExecutorConfig, Request, SamplingParams

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--max-tokens", type=int, default=128)
args = parser.parse_args()
ex = Executor(None, ExecutorConfig(quantization="gguf", max_batch_size=1, progress=False))
prompt = [{"role": "user", "content": "Write a long story about a robot who learns to paint."}]


def request(n: int) -> list[Request]:
    return [Request(prompt, SamplingParams(max_tokens=n, ignore_eos=True), request_id="a")]


ex.run(request(16))
stats = ex.speculation.stats
forwards, forward_s = stats.num_target_forwards, stats.target_time
start = time.perf_counter()
ex.run(request(args.max_tokens))
wall = time.perf_counter() - start
steps, forward_s = stats.num_target_forwards - forwards, stats.target_time - forward_s
print(
    f"{1e3 * wall / steps:.2f} ms a step, forward {1e3 * forward_s / steps:.2f} ms, "
    f"host {1e3 * (wall - forward_s) / steps:.2f} ms ({steps} steps)"
)
ex.close()
