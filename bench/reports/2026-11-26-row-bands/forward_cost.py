"""The target's forward cost over 1, 2, 3, 4 and 8 new tokens (after 128 cached ones) under each
cpu_linear setting, with an EAGLE-3 drafter of k=3 attached (so ``auto`` also weighs MKL's packed GEMM
for the 4-row verify): the embedded SmolLM2 in float32, the settings taking turns, median of the
rounds' medians (7 forwards each after one untimed), and each setting's process RSS.

    python bench/reports/2026-11-26-row-bands/forward_cost.py [--rounds 3]
"""

import argparse
import resource
from pathlib import Path

import torch
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.scratch_forward import scratch_forward
from specexec.executor.executor import Executor
from specexec.executor.layers.cpu_info import describe_cpu
from specexec.executor.layers.measurement_cache import median_seconds

SIZES = (1, 2, 3, 4, 8)


def rss_mib() -> float:  # Linux: the resident set from /proc
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024


SETTINGS = ("blas", "onednn", "auto")

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
print(f"{describe_cpu()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
spec = {"decoding_type": "Eagle", "max_draft_len": 3}
executors = {}
for setting in SETTINGS:
    before = rss_mib()
    executors[setting] = Executor(
        config=ExecutorConfig(progress=False, dtype="float32", cpu_linear=setting, speculative_config=spec)
    )
    grown = rss_mib() - before
    print(f"{setting}: {executors[setting].linear_backend.backend}; RSS grew {grown:.0f} MiB", flush=True)
rounds: dict[tuple[str, int], list[float]] = {}
with torch.inference_mode():
    for _ in range(args.rounds):
        for setting, executor in executors.items():
            runner, pages = executor.core.runner, executor.block_manager
            for n in SIZES:
                scratch_forward(runner, pages, n)
                seconds = median_seconds(lambda r=runner, p=pages, n=n: scratch_forward(r, p, n), 7)
                rounds.setdefault((setting, n), []).append(seconds)
for setting in SETTINGS:
    seconds = {n: sorted(rounds[setting, n])[len(rounds[setting, n]) // 2] for n in SIZES}
    cells = "  ".join(f"{n}: {seconds[n] * 1000:.1f} ms {seconds[n] / seconds[1]:.2f}x" for n in SIZES)
    print(f"{setting:>6}  {cells}", flush=True)
print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
