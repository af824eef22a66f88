"""One target forward of the embedded SmolLM2 at the GGUF's codes (own decoder, the layers as one op):
a decode row and a 4-row verify after ``--context`` cached tokens, per dtype and `quantized_kernel`, all
settings taking turns (medians of 15 rounds of 5 forwards), each setting's pool filled first.

    python bench/reports/2026-11-27-int8-tiles/step_cost.py [--context 300,1300] \
        [--settings bfloat16:auto,float32:auto]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from specexec import Executor, ExecutorConfig
from specexec.executor.model.forward_io import SequenceInput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="bfloat16:auto,float32:auto")
    parser.add_argument("--context", default="300,1300")
    args = parser.parse_args()
    contexts = [int(c) for c in args.context.split(",")]
    steps = {}
    for setting in args.settings.split(","):
        dtype, kernel = setting.split(":")
        config = ExecutorConfig(quantization="gguf", dtype=dtype, quantized_kernel=kernel, progress=False)
        executor = Executor(config=config)
        runner, bm = executor.core.runner, executor.block_manager
        print(f"{setting}: {executor.quantized_kernel.reason}")
        for context in contexts:
            name = f"{setting}@{context}"
            bm.allocate(name, context + 8)
            table = bm.block_tables[name]
            runner.forward([SequenceInput(list(range(100, 100 + context)), 0, table, 1)])
            for rows in (1, 4):
                steps[setting, context, rows] = (runner, table, context, rows)

    def run(runner, table, context, rows):
        return runner.forward([SequenceInput(list(range(5, 5 + rows)), context, table, rows)]).logits

    with torch.inference_mode():
        times = {key: [] for key in steps}
        for _ in range(15):
            for key, step in steps.items():
                started = time.perf_counter()
                for _ in range(5):
                    run(*step)
                times[key].append((time.perf_counter() - started) / 5 * 1e3)
    print(f"\n{'setting':22s} {'context':>7s} {'decode':>9s} {'4-row verify':>13s} {'ratio':>6s}")
    for setting in args.settings.split(","):
        for context in contexts:
            one, four = (statistics.median(times[setting, context, rows]) for rows in (1, 4))
            print(f"{setting:22s} {context:7d} {one:6.2f} ms {four:10.2f} ms {four / one:6.2f}")


if __name__ == "__main__":
    main()
