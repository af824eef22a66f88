"""One target forward of the embedded SmolLM2 at the GGUF's codes (own decoder, 300 cached tokens):
a decode row and a 4-row verify, per dtype and `quantized_kernel`, each with the layers as one C++ op
and in Python, all taking turns (medians of 15 rounds of 5 forwards).

    python bench/reports/2026-11-27-int8-dot/step_cost.py [--settings bfloat16:torch,bfloat16:auto,...]

Also checks that the layer op and the Python layers give the same logits, bit for bit.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from specexec import Executor, ExecutorConfig
from specexec.executor.model.decoder import forward as decoder_forward
from specexec.executor.model.forward_io import SequenceInput

CONTEXT = 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="bfloat16:torch,bfloat16:auto,float32:int8_dot,float32:torch")
    args = parser.parse_args()
    fused_step = decoder_forward.FusedStep.of
    steps = {}
    for setting in args.settings.split(","):
        dtype, kernel = setting.split(":")
        config = ExecutorConfig(quantization="gguf", dtype=dtype, quantized_kernel=kernel, progress=False)
        executor = Executor(config=config)
        runner, bm = executor.core.runner, executor.block_manager
        bm.allocate(setting, CONTEXT + 8)
        table = bm.block_tables[setting]
        runner.forward([SequenceInput(list(range(100, 100 + CONTEXT)), 0, table, 1)])
        print(f"{setting}: {executor.quantized_kernel.reason}")
        for rows in (1, 4):
            for fused in (True, False):
                steps[setting, rows, fused] = (runner, table, rows, fused)

    def run(runner, table, rows, fused):
        decoder_forward.FusedStep.of = fused_step if fused else classmethod(lambda cls, meta, hidden: None)
        try:
            return runner.forward([SequenceInput(list(range(5, 5 + rows)), CONTEXT, table, rows)]).logits
        finally:
            decoder_forward.FusedStep.of = fused_step

    with torch.inference_mode():
        for key, step in steps.items():
            if key[2]:
                same = torch.equal(run(*step), run(*steps[key[0], key[1], False]))
                print(f"{key[0]} {key[1]} rows: layer op == Python layers bit for bit: {same}")
        times = {key: [] for key in steps}
        for _ in range(15):
            for key, step in steps.items():
                started = time.perf_counter()
                for _ in range(5):
                    run(*step)
                times[key].append((time.perf_counter() - started) / 5 * 1e3)
    print(f"\n{'setting':22s} {'rows':>4s} {'layer op':>10s} {'Python':>10s}")
    for setting in args.settings.split(","):
        for rows in (1, 4):
            op, py = (statistics.median(times[setting, rows, f]) for f in (True, False))
            print(f"{setting:22s} {rows:4d} {op:8.2f} ms {py:8.2f} ms")


if __name__ == "__main__":
    main()
