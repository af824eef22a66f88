"""SmolLM2-135M's linear layers alone (30 layers of q, k, v, o, gate, up, down and the 49,152-row LM
head; random float32 weights of those shapes), at 1 to 8 rows under each kernel: the BLAS
(``F.linear``), oneDNN on packed weights, and MKL's packed GEMM packed for exactly 4 rows (other row
counts fall back to the BLAS inside the op). Median of 7, three rounds, kernels taking turns.

    python bench/reports/2026-11-26-row-bands/linear_rows.py
"""

import time

import torch
import torch.nn.functional as F
from specexec.executor.layers.cpu_info import describe_cpu

torch.manual_seed(0)
SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
layers = [[torch.randn(o, i) for o, i in SHAPES] for _ in range(30)] + [[torch.randn(49152, 576)]]
onednn = [[torch.ops.mkldnn._reorder_linear_weight(w) for w in layer] for layer in layers]
mkl4 = [[torch.ops.mkl._mkl_reorder_linear_weight(w, 4) for w in layer] for layer in layers]


def run(rows: int, kernel: str) -> None:
    inputs = {576: torch.randn(rows, 576), 1536: torch.randn(rows, 1536)}
    for weights, packed, packed4 in zip(layers, onednn, mkl4):
        for w, p, p4 in zip(weights, packed, packed4):
            x = inputs[w.shape[1]]
            if kernel == "blas":
                F.linear(x, w)
            elif kernel == "onednn":
                torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
            else:
                torch.ops.mkl._mkl_linear(x, p4, w, None, 4)


times: dict[tuple[str, int], list[float]] = {}
for _ in range(3):
    for rows in (1, 2, 3, 4, 8):
        for kernel in ("blas", "onednn", "mkl packed for 4"):
            run(rows, kernel)
            spent = []
            for _ in range(7):
                t = time.perf_counter()
                run(rows, kernel)
                spent.append(time.perf_counter() - t)
            times.setdefault((kernel, rows), []).append(sorted(spent)[3])
print(f"{describe_cpu()}, torch {torch.__version__}, {torch.get_num_threads()} threads; ms per pass")
for kernel in ("blas", "onednn", "mkl packed for 4"):
    cells = "  ".join(f"{rows}: {sorted(times[kernel, rows])[1] * 1000:.1f}" for rows in (1, 2, 3, 4, 8))
    print(f"{kernel:>17}  {cells}")
