"""int8_dot's q4_linear over a model's worth of SmolLM2-shaped int4 layers (30 x 576->960, 576->576, 576->3072,
1536->576; random codes) at 1-16 rows, bfloat16 activations; medians of 7 passes. The argument: torch threads.
    python bench/reports/2026-11-28-draft-policy-batch-cost/q4_rows.py 1"""

import statistics
import sys
import time

import torch
from specexec.executor.layers.quantized.quantized_dot import pack_q4, q4_linear

torch.set_num_threads(int(sys.argv[1]))
g = torch.Generator().manual_seed(0)
shapes = [(576, 960), (576, 576), (576, 3072), (1536, 576)]
tiles = []
for k, n in shapes:
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    sc = torch.rand(n, k // 32, generator=g) * 0.01
    tiles.append(pack_q4(q, sc, -8 * sc))
tiles = [t.clone() for _ in range(30) for t in tiles]
res = {}
for rows in (1, 2, 3, 4, 8, 16):
    xs = {k: torch.randn(rows, k).bfloat16() for k, _ in shapes}

    def go(xs=xs):
        for i, t in enumerate(tiles):
            q4_linear(xs[shapes[i % 4][0]], t)

    go()
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        go()
        ts.append(time.perf_counter() - t)
    res[rows] = statistics.median(ts) * 1e3
print({r: f"{v:.2f} ms ({v / res[1]:.2f}x)" for r, v in res.items()})
