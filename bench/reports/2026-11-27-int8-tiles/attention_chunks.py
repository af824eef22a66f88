"""The C++ paged attention kernel before and after this part's rewrite (tasks split into 256-key chunks,
scores by a transposing sum), on SmolLM2's heads (9 query, 3 KV, head 64) in bfloat16, pages of 16:
microseconds per layer, the two builds taking turns in one process.

    python bench/reports/2026-11-27-int8-tiles/attention_chunks.py

"warm": one pool called over and over (its keys in cache); "cold": 30 pools, one a layer, called in
turn, as a forward reads them. The "old" build is `paged_attention_cpu.cpp` as of commit 014a633.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

ROOT = Path(__file__).resolve().parents[3]
OLD_COMMIT = "014a633"
SOURCE = "executor/layers/paged_attention_cpu.cpp"
HEADS, KV_HEADS, HEAD_DIM, PAGE = 9, 3, 64, 16


def build() -> None:
    old = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:{SOURCE}"], capture_output=True, text=True, check=True
    ).stdout
    folder = Path(tempfile.mkdtemp())
    for name, text in (("old", old), ("new", (ROOT / SOURCE).read_text())):
        (folder / f"{name}.cpp").write_text(
            text.replace("TORCH_LIBRARY(specexec_cpu", f"TORCH_LIBRARY(attention_{name}")
        )
        load(
            name=f"attention_{name}",
            sources=[str(folder / f"{name}.cpp")],
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-math-errno"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
            is_python_module=False,
        )


def main() -> None:
    build()
    torch.set_num_threads(2)
    kernels = {
        "old": torch.ops.attention_old.paged_attention_short,
        "new": torch.ops.attention_new.paged_attention_short,
    }
    gen = torch.Generator().manual_seed(0)
    print(
        f"torch {torch.__version__}, 2 threads; microseconds per layer (medians of 12 rounds, builds taking turns)"
    )
    for context in (300, 1300):
        for requests in (1, 8):
            pages = (context + 8) // PAGE + 1
            pools = [
                torch.randn(2, requests * pages * PAGE + PAGE, KV_HEADS, HEAD_DIM, generator=gen).to(
                    torch.bfloat16
                )
                for _ in range(30)
            ]
            tables = (torch.arange(requests * pages) + 1).view(requests, pages)
            for queries in (1, 4):
                q = torch.randn(requests, queries, HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
                positions = torch.arange(context, context + queries).repeat(requests, 1)
                lens = torch.full((requests,), context + queries)
                args = (tables, positions, lens, PAGE, 0.125, 0, 0.0)
                torch.testing.assert_close(
                    kernels["old"](q, pools[0], *args).float(),
                    kernels["new"](q, pools[0], *args).float(),
                    rtol=2e-2,
                    atol=2e-2,
                )
                times = {(name, kind): [] for name in kernels for kind in ("warm", "cold")}
                for _ in range(12):
                    for name, kernel in kernels.items():
                        started = time.perf_counter()
                        for pool in pools:
                            kernel(q, pool, *args)
                        times[name, "cold"].append((time.perf_counter() - started) / len(pools) * 1e6)
                        started = time.perf_counter()
                        for _ in range(len(pools)):
                            kernel(q, pools[0], *args)
                        times[name, "warm"].append((time.perf_counter() - started) / len(pools) * 1e6)
                cells = [
                    f"{kind} old {statistics.median(times['old', kind]):7.1f} new {statistics.median(times['new', kind]):7.1f}"
                    for kind in ("warm", "cold")
                ]
                print(
                    f"context {context:4d}, {requests} request(s), {queries} queries each: "
                    + " | ".join(cells),
                    flush=True,
                )


if __name__ == "__main__":
    main()
