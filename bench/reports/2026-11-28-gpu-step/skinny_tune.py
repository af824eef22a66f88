"""cuBLAS against the skinny-GEMM Triton kernel's configs, for the decode steps' projection shapes.

    python bench/reports/2026-11-28-gpu-step/skinny_tune.py [--rows 1,4,8,16] [--output tune.json]

For each weight shape of Llama-3-8B and SmolLM2-135M (fused q/k/v, o, fused gate/up, down, LM head) and
each row count: every `CANDIDATES` config and ``F.linear`` (cuBLAS), each timed as a step runs it:
inside a CUDA graph, over enough copies of the weight (>= 4x the L2 cache) that each call reads its
weight from memory. Prints µs a call and the weight bytes read per second, the best config per case,
and the largest difference from ``F.linear`` (in units of the output's rounding).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F
from specexec.executor.layers.triton_kernels.skinny_gemm import CANDIDATES, skinny_gemm

SHAPES = {  # name: (N, K)
    "llama8b.qkv": (6144, 4096), "llama8b.o": (4096, 4096), "llama8b.gate_up": (28672, 4096),
    "llama8b.down": (4096, 14336), "llama8b.lm_head": (49152, 4096),
    "smollm2.qkv": (960, 576), "smollm2.o": (576, 576), "smollm2.gate_up": (3072, 576),
    "smollm2.down": (576, 1536), "smollm2.lm_head": (49152, 576),
}  # fmt: skip


def graph_time(calls, repeats: int = 10) -> float:
    """µs a call of ``calls`` (a list of closures), captured in one graph and replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / (repeats * len(calls))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,4,8,16")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"{torch.cuda.get_device_name()}, L2 {l2 / 2**20:.0f} MiB, torch {torch.__version__}")
    results = []
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        nbytes = n * k * 2
        copies = max(2, -(-4 * l2 // nbytes))
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for m in [int(r) for r in args.rows.split(",")]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, weights[0]).float()
            ulp = ref.abs().max().item() * 2**-8
            cases = {"cublas": lambda w, x=x: F.linear(x, w)}
            cases.update(
                {c.describe(): (lambda w, c=c, x=x: skinny_gemm(x, w, None, c)[0]) for c in CANDIDATES}
            )
            row = {"shape": name, "n": n, "k": k, "rows": m, "us": {}, "max_diff_ulps": {}}
            for label, fn in cases.items():
                try:
                    diff = (fn(weights[0]).float() - ref).abs().max().item() / ulp
                    us = graph_time([lambda w=w, fn=fn: fn(w) for w in weights])
                except Exception as exc:  # a config this Triton cannot build: say so, go on
                    print(f"  {name} m={m} {label}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                row["us"][label], row["max_diff_ulps"][label] = us, diff
            best = min((v, lab) for lab, v in row["us"].items() if lab != "cublas")
            cub = row["us"].get("cublas", float("nan"))
            print(
                f"{name:16} m={m:2}  cublas {cub:8.2f} us {nbytes / cub / 1e3:6.0f} GB/s   best {best[1]:16} "
                f"{best[0]:8.2f} us {nbytes / best[0] / 1e3:6.0f} GB/s  ({cub / best[0]:.2f}x; "
                f"diff {row['max_diff_ulps'][best[1]]:.2f} ulp)"
            )
            results.append(row)
        del weights
        torch.cuda.empty_cache()
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
