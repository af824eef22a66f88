"""The C++ paged attention kernel before and after this report's change, in one process, taking turns:
SmolLM2's heads (9 query, 3 KV, 64 wide), bfloat16, a 30-layer pool in one memory map (as the KV cache
lies), pages in order (as a fresh block manager hands them out). "cold" walks the 30 layers (the pool
streams from memory, as in a decode step); "warm" repeats layer 0 (in cache). Microseconds a layer, the
best of 5 passes, three turns each.

    python attention_ab.py [--before fa66346] [--cases 1300x1x1,1300x4x1,...]   (keys x queries x requests)
"""

from __future__ import annotations

import argparse
import math
import mmap
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

LAYERS = Path(__file__).resolve().parents[3] / "executor" / "layers"
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno"]


def build(name: str, source_text: str, folder: Path, headers: dict[str, str]):
    """The kernel from ``source_text`` as torch.ops.<name> (its library renamed so both load)."""
    folder.mkdir(parents=True, exist_ok=True)
    for header, text in headers.items():
        (folder / header).write_text(text)
    source = folder / f"{name}.cpp"
    source.write_text(source_text.replace("TORCH_LIBRARY(specexec_cpu, m)", f"TORCH_LIBRARY({name}, m)"))
    load(
        name=name,
        sources=[str(source)],
        extra_cflags=CFLAGS,
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        is_python_module=False,
    )
    return getattr(torch.ops, name).paged_attention_short


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="fa66346", help="the commit of the kernel before")
    parser.add_argument("--cases", default="100x1x1,300x1x1,1300x1x1,1300x4x1,300x4x8,1300x1x8,1300x4x8")
    args = parser.parse_args()
    repo = LAYERS.parents[1]

    def at(commit: str, path: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
        ).stdout

    work = Path(tempfile.mkdtemp(prefix="attention_ab_"))
    before = build(
        "attention_before", at(args.before, "executor/layers/paged_attention_cpu.cpp"), work / "before", {}
    )
    headers = {h.name: h.read_text() for h in LAYERS.glob("attention_*.h")}
    after = build(
        "attention_after", (LAYERS / "paged_attention_cpu.cpp").read_text(), work / "after", headers
    )
    kernels = {"before": before, "after": after}

    torch.manual_seed(0)
    block, layers, num_blocks = 16, 30, 4000
    shape = (layers, 2, (num_blocks + 1) * block, 3, 64)
    num_bytes = math.prod(shape) * 2
    pool_map = mmap.mmap(-1, num_bytes)
    kv = torch.frombuffer(pool_map, dtype=torch.uint8)[:num_bytes].view(torch.bfloat16).view(shape)
    kv.copy_(torch.randn(shape[2:]).to(torch.bfloat16).expand(shape))
    print(f"threads {torch.get_num_threads()}; microseconds a layer, before -> after (three turns each)")
    for case in args.cases.split(","):
        keys, queries, requests = (int(x) for x in case.split("x"))
        pages = -(-keys // block)
        tables = torch.arange(requests * pages).view(requests, pages)
        q = torch.randn(requests, queries, 9, 64).to(torch.bfloat16)
        positions = torch.arange(keys - queries, keys).repeat(requests, 1)
        lens = torch.full((requests,), keys)
        call = (tables, positions, lens, block, 0.125, 0, 0.0)
        for cold in (False, True):
            times: dict[str, list[float]] = {name: [] for name in kernels}
            for _ in range(3):
                for name, kernel in kernels.items():
                    best = math.inf
                    for _ in range(5):
                        start = time.perf_counter()
                        for layer in range(layers):
                            kernel(q, kv[layer if cold else 0], *call)
                        best = min(best, (time.perf_counter() - start) / layers * 1e6)
                    times[name].append(best)
            cells = " | ".join(f"{name} " + "/".join(f"{t:.0f}" for t in ts) for name, ts in times.items())
            ratio = min(times["after"]) / min(times["before"])
            print(
                f"{'cold' if cold else 'warm'} {keys} keys x {queries} queries x {requests} requests: "
                f"{cells}  (after / before {ratio:.2f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
