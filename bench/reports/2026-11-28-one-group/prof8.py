"""One scenario of profile_step (batch, fixed drafts) on a dataset's prompts at the GGUF's codes: the wall
time per step, then torch.profiler's op table over 8 steps.

    python prof8.py specbench 8 [drafts]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from specexec.bench import profile_step as ps
from specexec.prompt_sets.datasets import load_dataset

dataset, batch = sys.argv[1], int(sys.argv[2])
drafts = int(sys.argv[3]) if len(sys.argv) > 3 else 0
ps.load_dataset = lambda name, n: load_dataset(dataset, n)
scenario = ps.Scenario(f"b{batch}", batch, drafts)
executor = ps.make_executor("bfloat16", scenario, "gguf")
ps.start_requests(executor, scenario, warmup_steps=20)
walls = []
for _ in range(16):
    start = time.perf_counter()
    executor.step()
    walls.append(time.perf_counter() - start)
print("wall ms", statistics.median(walls) * 1e3)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    for _ in range(8):
        with torch.profiler.record_function(ps.STEP):
            executor.step()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
executor.close()
