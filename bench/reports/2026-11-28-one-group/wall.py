"""Median (and p10) wall time of executor steps at the GGUF's codes: batch 1 and 8, without drafts and
with 3 fixed drafts a request, on a dataset's prompts (profile_step's scenarios, no profiler).

    python wall.py specbench bfloat16
"""

from __future__ import annotations

import statistics
import sys
import time

from specexec.bench import profile_step as ps
from specexec.prompt_sets.datasets import load_dataset

dataset, dtype = sys.argv[1], sys.argv[2]
ps.load_dataset = lambda name, n: load_dataset(dataset, n)
cells = []
for batch, drafts in ((1, 0), (1, 3), (8, 0), (8, 3)):
    scenario = ps.Scenario(f"b{batch}", batch, drafts)
    executor = ps.make_executor(dtype, scenario, "gguf")
    ps.start_requests(executor, scenario, warmup_steps=10)
    walls = []
    for _ in range(40):
        start = time.perf_counter()
        executor.step()
        walls.append(time.perf_counter() - start)
    walls.sort()
    median, p10 = statistics.median(walls) * 1e3, walls[len(walls) // 10] * 1e3
    cells.append(f"b{batch} k{drafts}: {median:.2f} (p10 {p10:.2f}) ms")
    executor.close()
print(dtype, dataset, " | ".join(cells))
