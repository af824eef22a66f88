"""The int8_dot kernels alone against torch's weight-only kernels on SmolLM2's layer shapes, one layer
at a time (its weights warm in cache), at 1 and 4 rows, bfloat16 and float32 activations.

    python bench/reports/2026-11-27-int8-dot/kernel_isa.py                      # this CPU's build
    ATEN_CPU_CAPABILITY=avx2 python bench/reports/2026-11-27-int8-dot/kernel_isa.py -march=x86-64-v3

The second form builds the kernels for AVX2 alone and holds torch's kernels to their AVX2 code, as an
AVX2-only CPU would run both (the same machine's memory and clock, so an estimate, not that CPU).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

SOURCE = Path(__file__).resolve().parents[3] / "executor" / "layers" / "quantized" / "quantized_dot_cpu.cpp"
SHAPES = [
    (960, 576),
    (576, 576),
    (3072, 576),
    (576, 1536),
    (49152, 576),
]  # [out, in]: qkv, o, gate/up, down, head


def median_us(fn, calls: int = 200) -> float:
    for _ in range(10):
        fn()
    samples = []
    for _ in range(calls // 10):
        started = time.perf_counter()
        for _ in range(10):
            fn()
        samples.append((time.perf_counter() - started) / 10 * 1e6)
    return statistics.median(samples)


def main() -> None:
    flags = sys.argv[1:] or ["-march=native"]
    load(
        name="int8_dot_" + "_".join(f.strip("-").replace("=", "_").replace("-", "_") for f in flags),
        sources=[str(SOURCE)],
        extra_cflags=["-O3", "-fopenmp", *flags],
        extra_ldflags=["-fopenmp"],
        build_directory=tempfile.mkdtemp(),
        is_python_module=False,
    )
    ops = torch.ops.specexec_cpu
    torch.set_num_threads(2)
    print(f"int8_dot built with {' '.join(flags)}: {ops.quantized_dot_isa()}; torch {torch.__version__}")
    print(
        f"{'layer':>10s} {'dtype':>9s} {'rows':>4s} {'int4 torch':>11s} {'q4 int8_dot':>12s} {'int8 torch':>11s} {'q8 int8_dot':>12s}"
    )
    gen = torch.Generator().manual_seed(0)
    for out_features, in_features in SHAPES:
        groups = in_features // 32
        q = torch.randint(0, 16, (out_features, in_features), generator=gen, dtype=torch.uint8)
        scale = (torch.rand(out_features, groups, generator=gen) * 0.01).half().float()
        offset = (-torch.rand(out_features, groups, generator=gen) * 0.08).half().float()
        blocks = q.view(out_features, groups, 32)
        codes = (blocks[..., :16] | (blocks[..., 16:] << 4)).reshape(out_features, -1)
        records = torch.cat([codes, torch.cat([scale, offset], 1).half().view(torch.uint8)], 1).contiguous()
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        w8 = torch.randint(-127, 128, (out_features, in_features), generator=gen, dtype=torch.int8)
        s8 = torch.rand(out_features, generator=gen) * 0.01
        for dtype in (torch.bfloat16, torch.float32):
            table = torch.stack([scale, offset + 8 * scale], -1).transpose(0, 1).contiguous().to(dtype)
            s8_dtype = s8.to(dtype)
            for rows in (1, 4):
                x = torch.randn(rows, in_features, generator=gen).to(dtype)
                calls = [
                    (torch.ops.aten._weight_int4pack_mm_for_cpu, (x, packed, 32, table)),
                    (ops.q4_linear, (x, records)),
                    (torch._weight_int8pack_mm, (x, w8, s8_dtype)),
                    (ops.q8_linear, (x, w8, s8)),
                ]
                times = [median_us(lambda fn=fn, a=a: fn(*a)) for fn, a in calls]
                print(
                    f"{out_features:>5d}x{in_features:<4d} {str(dtype).removeprefix('torch.'):>9s} {rows:4d}"
                    + "".join(f" {t:9.1f} us" for t in times)
                )


if __name__ == "__main__":
    main()
