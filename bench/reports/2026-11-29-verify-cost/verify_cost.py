"""A forward over n new tokens against one, at a context of 0 and 1,024 tokens: specexec's (``quantization:
gguf``, the executor's own choices) beside llama.cpp's ``llama-bench -p N -d D`` on the same file, taking
turns (``python verify_cost.py LLAMA_BENCH FILE...``; one JSON line per file and round)."""

import json
import re
import statistics
import subprocess
import sys
import time

from specexec import Executor, ExecutorConfig

TOKENS = (1, 4, 8)
CONTEXTS = (0, 1024)
ROUNDS = 3
REPEATS = 7  #: timed forwards per (n, context) and round; the median is kept


def specexec_ms(executor: Executor) -> dict[str, float]:
    times = {}
    for context in CONTEXTS:
        for n in TOKENS:
            executor.time_forward(n, context)  # warm
            samples = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                executor.time_forward(n, context)
                samples.append((time.perf_counter() - start) * 1000)
            times[f"pp{n}@d{context}"] = statistics.median(samples)
    return times


def llama_bench_ms(llama_bench: str, path: str) -> dict[str, float]:
    """Milliseconds a batch of n tokens, from llama-bench's tokens per second."""
    prompts, depths = ",".join(map(str, TOKENS)), ",".join(map(str, CONTEXTS))
    command = [llama_bench, "-m", path, "-t", "2", "-p", prompts, "-n", "0", "-d", depths, "-r", str(REPEATS)]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    times = {}
    for line in output.splitlines():
        match = re.search(r"\|\s+pp(\d+)(?: @ d(\d+))?\s+\|\s+([\d.]+) ±", line)
        if match:
            n, depth, rate = int(match[1]), int(match[2] or 0), float(match[3])
            times[f"pp{n}@d{depth}"] = n / rate * 1000
    return times


def main() -> None:
    llama_bench, files = sys.argv[1], sys.argv[2:]
    executors = {
        path: Executor(path, ExecutorConfig(quantization="gguf", max_num_tokens=2048, progress=False))
        for path in files
    }
    for round_ in range(ROUNDS):
        for path, executor in executors.items():
            for engine, times in (
                ("specexec", specexec_ms(executor)),
                ("llama.cpp", llama_bench_ms(llama_bench, path)),
            ):
                print(json.dumps({"file": path, "round": round_, "engine": engine, "ms": times}), flush=True)


if __name__ == "__main__":
    main()
