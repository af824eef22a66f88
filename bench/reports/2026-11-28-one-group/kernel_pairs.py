"""The int8_dot kernels alone, best of 3 timings per row count: a 3072x576 Q4 layer in cache, 60 such
layers cycled (66 MB: the weights come from memory, as in a decode step), and a 49152x576 int8 layer
with block scales (the GGUF's Q8_0 LM head). Run it on two builds in turn (the kernel source as
committed, and the one before) to compare.

    python bench/reports/2026-11-28-one-group/kernel_pairs.py [--threads 1] [--rows 1,4,8,32,512]
"""

from __future__ import annotations

import argparse
import time

import torch
from specexec.executor.layers.quantized.quantized_dot import (
    pack_q4,
    pack_q8,
    q4_linear,
    q8_linear,
    tile_block_scales,
)


def best_us(fn, calls: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def q4_layer(out_features: int, in_features: int) -> torch.Tensor:
    codes = torch.randint(0, 16, (out_features, in_features), dtype=torch.uint8)
    groups = in_features // 32
    return pack_q4(codes, torch.rand(out_features, groups) * 0.02, -torch.rand(out_features, groups) * 0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="1,4,8,32,512")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hot, cold = q4_layer(3072, 576), [q4_layer(3072, 576) for _ in range(60)]
    head = pack_q8(torch.randint(-127, 128, (49152, 576), dtype=torch.int8))
    head_scale = tile_block_scales(torch.rand(49152, 18) * 0.01)
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, 576).bfloat16()
        in_cache = best_us(lambda x=x: q4_linear(x, hot), max(5, 2000 // rows))
        from_memory = best_us(lambda x=x: [q4_linear(x, layer) for layer in cold], 1) / len(cold)
        lm_head = best_us(lambda x=x: q8_linear(x, head, head_scale), 5)
        print(
            f"{args.threads} threads, {rows} rows: Q4 in cache {in_cache:.1f} us, from memory {from_memory:.1f} us;"
            f" Q8_0 head {lm_head:.0f} us"
        )


if __name__ == "__main__":
    main()
