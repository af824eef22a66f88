"""int8_dot's kernels before and after the tiled layout, one layer at a time (its weights warm in cache),
on SmolLM2's layer shapes: microseconds per call, the two builds taking turns in one process.

    python bench/reports/2026-11-27-int8-tiles/kernel_tiles.py [--old COMMIT] [-march=native]

The "old" build is `quantized_dot_cpu.cpp` as of commit e858214 (one weight row a pass, a horizontal sum
per row and block) or ``--old``'s; "new" is the working tree's (8 weight rows interleaved per tile). Both
outputs are checked to agree on every shape first; the old build must take the same inputs (from 014a633
on, the tiles).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

ROOT = Path(__file__).resolve().parents[3]
OLD_COMMIT = "e858214"
SOURCE = "executor/layers/quantized/quantized_dot_cpu.cpp"
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]  # qkv, o, gate/up, down, head


def build(flags: list[str], old_commit: str) -> None:
    old = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{old_commit}:{SOURCE}"], capture_output=True, text=True, check=True
    ).stdout
    folder = Path(tempfile.mkdtemp())
    sources = {
        "old": old.replace("TORCH_LIBRARY_FRAGMENT(specexec_cpu", "TORCH_LIBRARY_FRAGMENT(specexec_old"),
        "new": (ROOT / SOURCE)
        .read_text()
        .replace("TORCH_LIBRARY_FRAGMENT(specexec_cpu", "TORCH_LIBRARY_FRAGMENT(specexec_new"),
    }
    for name, text in sources.items():
        (folder / f"{name}.cpp").write_text(text)
        load(
            name=f"tiles_{name}",
            sources=[str(folder / f"{name}.cpp")],
            extra_cflags=["-O3", "-fopenmp", "-fno-math-errno", *flags],
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
            is_python_module=False,
        )


def median_us(fn, calls: int = 100) -> float:
    for _ in range(5):
        fn()
    samples = []
    for _ in range(calls // 5):
        started = time.perf_counter()
        for _ in range(5):
            fn()
        samples.append((time.perf_counter() - started) / 5 * 1e6)
    return statistics.median(samples)


def main() -> None:
    sys.path.insert(0, str(ROOT.parent))
    from specexec.executor.layers.quantized.quantized_dot import pack_q4, pack_q8, tile_block_scales

    args = sys.argv[1:]
    old_commit = OLD_COMMIT
    if args[:1] == ["--old"]:
        old_commit, args = args[1], args[2:]
    build(args or ["-march=native"], old_commit)
    tiled_old = old_commit != OLD_COMMIT
    old, new = torch.ops.specexec_old, torch.ops.specexec_new
    torch.set_num_threads(2)
    print(f"isa: {new.quantized_dot_isa()}; torch {torch.__version__}; 2 threads; microseconds per call")
    gen = torch.Generator().manual_seed(0)
    for n, k in SHAPES:
        g = k // 32
        q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
        scale = (torch.rand(n, g, generator=gen) * 0.01).half().float()
        offset = (-torch.rand(n, g, generator=gen) * 0.08).half().float()
        blocks = q.view(n, g, 32)
        codes = (blocks[..., :16] | (blocks[..., 16:] << 4)).reshape(n, -1)
        records = torch.cat([codes, torch.cat([scale, offset], 1).half().view(torch.uint8)], 1).contiguous()
        tiles = pack_q4(q, scale, offset)
        w8 = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
        block_scale = torch.rand(n, g, generator=gen) * 0.01
        t8, tiled_scale = pack_q8(w8), tile_block_scales(block_scale)
        for dtype in (torch.bfloat16, torch.float32):
            for rows in (1, 4, 8, 32):
                if n == 49152 and rows > 8:
                    continue
                x = torch.randn(rows, k, generator=gen).to(dtype)
                old_q4 = (x, tiles) if tiled_old else (x, records)
                old_q8 = (x, t8, tiled_scale) if tiled_old else (x, w8, block_scale)
                pairs = {
                    "q4": (partial(old.q4_linear, *old_q4), partial(new.q4_linear, x, tiles)),
                    "q8_0": (partial(old.q8_linear, *old_q8), partial(new.q8_linear, x, t8, tiled_scale)),
                }
                cells = []
                for name, (a, b) in pairs.items():
                    torch.testing.assert_close(a().float(), b().float(), rtol=1e-2, atol=1e-2)
                    cells.append(f"{name} old {median_us(a):8.1f} new {median_us(b):8.1f}")
                print(f"{n}x{k} {str(dtype)[6:]:8s} rows={rows:2d}  " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
