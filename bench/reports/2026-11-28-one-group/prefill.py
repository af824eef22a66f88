"""Wall time of prefilling a dataset's prompts together (one request each, max_tokens 1) at the GGUF's
codes, after one untimed round: the median of 3 rounds.

    python bench/reports/2026-11-28-one-group/prefill.py [--dataset specbench] [--num 8]
"""

from __future__ import annotations

import argparse
import statistics
import time

from specexec import Executor, ExecutorConfig
from specexec.executor.engine.request import Request
from specexec.prompt_sets.datasets import load_dataset
from specexec.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="specbench")
    parser.add_argument("--num", type=int, default=8)
    args = parser.parse_args()
    executor = Executor(config=ExecutorConfig(quantization="gguf", max_num_tokens=4096, progress=False))
    prompts = [
        executor.tokenizer.apply_chat_template(
            p.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for p in load_dataset(args.dataset, args.num)
    ]
    walls = []
    for _ in range(4):
        requests = [Request(list(ids), SamplingParams(max_tokens=1)) for ids in prompts]
        start = time.perf_counter()
        executor.run(requests)
        walls.append(time.perf_counter() - start)
    executor.close()
    tokens = sum(len(ids) for ids in prompts)
    print(f"{args.dataset}: {args.num} prompts, {tokens} tokens: {statistics.median(walls[1:]):.3f} s")


if __name__ == "__main__":
    main()
