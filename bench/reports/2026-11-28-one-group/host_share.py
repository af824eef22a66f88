"""How much of a batch-1 GGUF decode step is outside the model's two big ops (the decoder stack as one
C++ op, the LM head), timed without a profiler: Python and the small torch ops around them (embedding,
final norm, sampling). An upper bound on the step's Python.

    python bench/reports/2026-11-28-one-group/host_share.py [--dataset specbench|extraction] [--steps 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

from specexec import Executor, ExecutorConfig
from specexec.executor.engine.request import Request
from specexec.executor.model.decoder import forward as decoder_forward
from specexec.prompt_sets.datasets import load_dataset
from specexec.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="specbench")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    executor = Executor(config=ExecutorConfig(quantization="gguf", progress=False))
    inside: list[float] = []

    def timed(fn):
        def call(*a, **k):
            start = time.perf_counter()
            out = fn(*a, **k)
            inside.append(time.perf_counter() - start)
            return out

        return call

    head = executor.model.lm_head
    decoder_forward.run_stack, head.forward = timed(decoder_forward.run_stack), timed(head.forward)
    prompt = load_dataset(args.dataset, 1)[0]
    ids = executor.tokenizer.apply_chat_template(
        prompt.messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    state = executor.add_request(Request(list(ids), SamplingParams(max_tokens=100_000, ignore_eos=True)))
    while not state.num_output_tokens:
        executor.step()
    for _ in range(10):
        executor.step()
    shares, walls = [], []
    for _ in range(args.steps):
        inside.clear()
        start = time.perf_counter()
        executor.step()
        wall = time.perf_counter() - start
        walls.append(wall)
        shares.append(1 - sum(inside) / wall)
    executor.close()
    print(
        f"{args.dataset}: {len(ids)}-token prompt, batch-1 decode step {statistics.median(walls) * 1e3:.2f} ms"
        f" (median of {args.steps}); outside the stack and the head: median"
        f" {100 * statistics.median(shares):.1f}%, p10 {100 * sorted(shares)[len(shares) // 10]:.1f}%"
    )


if __name__ == "__main__":
    main()
