"""The target's forward cost over 1, 2, 4 and 8 new tokens (after 128 cached ones) under each cpu_linear
backend: the embedded SmolLM2 in float32, median of 7 forwards after one untimed.

    python bench/reports/2026-11-25-cpu-linear/forward_cost.py
"""

import torch
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.scratch_forward import scratch_forward
from specexec.executor.executor import Executor
from specexec.executor.layers.cpu_info import describe_cpu
from specexec.executor.layers.measurement_cache import median_seconds

SIZES = (1, 2, 4, 8)

print(f"{describe_cpu()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
for backend in ("blas", "onednn"):
    with Executor(config=ExecutorConfig(progress=False, dtype="float32", cpu_linear=backend)) as executor:
        runner, pages = executor.core.runner, executor.block_manager
        with torch.inference_mode():
            for n in SIZES:
                scratch_forward(runner, pages, n)
            seconds = {
                n: median_seconds(lambda r=runner, p=pages, n=n: scratch_forward(r, p, n), 7) for n in SIZES
            }
    cells = "  ".join(f"{n}: {seconds[n] * 1000:.0f} ms {seconds[n] / seconds[1]:.2f}x" for n in SIZES)
    print(f"{backend:>6}  {cells}", flush=True)
