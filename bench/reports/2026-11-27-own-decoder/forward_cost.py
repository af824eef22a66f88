"""The target's forward over 1, 2, 4 and 8 new tokens after 1,024 cached ones, for transformers'
modules and specexec's own decoder, dense and at the GGUF's own codes (dtype auto): the embedded
SmolLM2, the settings taking turns round by round, each size the median of 7 forwards after one
untimed, the median over rounds.

    python bench/reports/2026-11-27-own-decoder/forward_cost.py [--rounds 3] [--context 1024]
"""

import argparse

import torch
from specexec.executor.config import ExecutorConfig
from specexec.executor.executor import Executor
from specexec.executor.layers.cpu_info import describe_cpu
from specexec.executor.layers.measurement_cache import median_seconds
from specexec.executor.model.forward_io import SequenceInput

SIZES = (1, 2, 4, 8)
SETTINGS = {
    "transformers": {"model_impl": "transformers"},
    "specexec": {"model_impl": "specexec"},
    "gguf transformers": {"model_impl": "transformers", "quantization": "gguf"},
    "gguf specexec": {"model_impl": "specexec", "quantization": "gguf"},
}

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--context", type=int, default=1024)
args = parser.parse_args()
print(
    f"{describe_cpu()}, torch {torch.__version__}, {torch.get_num_threads()} threads, context {args.context}"
)
executors = {name: Executor(config=ExecutorConfig(progress=False, **keys)) for name, keys in SETTINGS.items()}
for name, executor in executors.items():
    pages = executor.block_manager
    pages.allocate("bench", args.context + max(SIZES))
    prompt = [(17 * i) % 4000 + 100 for i in range(args.context)]
    executor.core.runner.forward([SequenceInput(prompt, 0, pages.block_tables["bench"], 1)])
    print(f"{name}: dtype {next(executor.model.parameters()).dtype}, model_impl {executor.model_impl.impl}")
rounds: dict[tuple[str, int], list[float]] = {}
with torch.inference_mode():
    for _ in range(args.rounds):
        for name, executor in executors.items():
            runner, table = executor.core.runner, executor.block_manager.block_tables["bench"]
            for n in SIZES:
                step = [SequenceInput(list(range(5, 5 + n)), args.context, table, n)]
                runner.forward(step)
                seconds = median_seconds(lambda r=runner, s=step: r.forward(s), 7)
                rounds.setdefault((name, n), []).append(seconds)
for name in SETTINGS:
    seconds = {n: sorted(rounds[name, n])[len(rounds[name, n]) // 2] for n in SIZES}
    cells = "  ".join(f"{n}: {seconds[n] * 1000:.1f} ms {seconds[n] / seconds[1]:.2f}x" for n in SIZES)
    print(f"{name:>18}  {cells}", flush=True)
