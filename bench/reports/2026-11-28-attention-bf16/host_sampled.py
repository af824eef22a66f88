"""A sampled view of a batch-1 GGUF decode step (no profiler in the process): py-spy samples the stepping
loop without stopping it (--nonblocking; stopping the process at every sample stalls the C++ ops'
threads and inflates their share), and the samples outside the decoder-stack op and the LM head are grouped by the functions they
lie in (inclusive), as shares of all samples.

    pip install py-spy
    py-spy record --nonblocking -r 500 -f raw -o steps.raw -- python host_sampled.py run
    python host_sampled.py share steps.raw
"""

from __future__ import annotations

import sys
from collections import Counter

BIG_OPS = ("run_stack", "lm_head", "WeightOnlyLinear", "Int8BlockLinear")


def run(steps: int = 3000) -> None:
    from specexec import Executor, ExecutorConfig
    from specexec.executor.engine.request import Request
    from specexec.prompt_sets.datasets import load_dataset
    from specexec.sampling import SamplingParams

    executor = Executor(config=ExecutorConfig(quantization="gguf", progress=False))
    prompt = load_dataset("specbench", 1)[0]
    ids = executor.tokenizer.apply_chat_template(
        prompt.messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    state = executor.add_request(Request(list(ids), SamplingParams(max_tokens=100_000, ignore_eos=True)))
    while not state.num_output_tokens:
        executor.step()
    for _ in range(steps):
        executor.step()
    executor.close()


def share(raw: str) -> None:
    total, outside, by_function = 0, 0, Counter()
    with open(raw) as samples:
        lines = samples.readlines()
    for line in lines:
        stack, count = line.rstrip("\n").rsplit(" ", 1)
        frames = stack.split(";")
        if not any("EngineCore.step" in f for f in frames):
            continue  # loading and prefill
        total += int(count)
        if "OpOverloadPacket.__call__" in frames[-1] and any(op in stack for op in BIG_OPS):
            continue
        outside += int(count)
        for name in {f.split(" (")[0] for f in frames}:
            by_function[name] += int(count)
    print(f"{total} samples in steps; outside the stack op and the LM head: {100 * outside / total:.1f}%")
    for name, count in by_function.most_common(25):
        print(f"{100 * count / total:5.1f}%  {name}")


if __name__ == "__main__":
    run() if sys.argv[1] == "run" else share(sys.argv[2])
