"""Which of the own decoder's projections run the skinny-GEMM Triton kernel on CUDA, and at which row
counts (`layers/skinny_linear.py` runs them).

The measurement (at start-up on CUDA, before the graphs are captured): each group of layers with the
same shape and role is timed inside a CUDA graph that calls every layer of the group once (their own
weights, as a step reads them), at each of `ROW_BUCKETS`; a config is kept only where it takes under
`MARGIN` of the cuBLAS path's time (for a projection after a norm, against the pair it replaces:
`fused_ops.add_rms_norm` and cuBLAS). Rows above the largest bucket (prefill) always run on cuBLAS. The
times are kept for the process, so every executor of one process runs the same kernels.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.skinny_linear import ROW_BUCKETS, wrap_projections
from ..layers.triton_kernels import triton_available

logger = logging.getLogger("specexec")

MARGIN = 0.97  #: the Triton kernel must take under this fraction of the cuBLAS path's time
#: (GPU, dtype, projection, N, K, fused norm, rows) -> the times measured, once per process, so that two
#: executors of one process run the same kernels (and give the same tokens)
_MEASURED: dict[tuple, tuple[float, list]] = {}


@dataclass(slots=True)
class SkinnyChoice:
    """What the measurement chose: one line per group of layers and row bucket."""

    kernel: str  #: "skinny" (some projections run the Triton kernel), "cublas", or "off"
    reason: str
    lines: list[str] = field(default_factory=list)  #: group, rows: cuBLAS µs, best config µs, chosen


def _graph_us(calls: list[Callable[[], object]], repeats: int = 5) -> float:
    """µs a call: ``calls`` captured in one CUDA graph (after one eager run), replayed ``repeats`` times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for call in calls:
            call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / (repeats * len(calls))


def choose_skinny_kernels(model: nn.Module, max_rows: int) -> SkinnyChoice:
    """Measure and set each projection's kernel per row bucket (up to ``max_rows``, the most rows a
    decode or verify step has) for a model converted to the own decoder; with no measured win every
    projection stays on cuBLAS. Other devices and dtypes: nothing changes."""
    param = next(model.parameters())
    if param.device.type != "cuda" or param.dtype not in (torch.bfloat16, torch.float16):
        return SkinnyChoice("off", f"{param.device.type} {param.dtype}: the kernel is for CUDA in 16 bits")
    projections = wrap_projections(model)
    for _, proj, _ in projections:  # (a model an earlier executor measured is measured again)
        proj.configs = {}
    if not projections:
        return SkinnyChoice("off", "no dense projection of the own decoder (quantized layers)")
    if not triton_available():
        return SkinnyChoice("off", "Triton kernels off or not importable: cuBLAS")
    groups: dict[tuple, list] = defaultdict(list)
    for name, proj, norm in projections:
        key = (name, proj.out_features, proj.in_features, proj.bias is not None, norm is not None)
        groups[key].append((proj, norm))
    # a bucket is measured when some step has more rows than the bucket before it
    buckets = [b for i, b in enumerate(ROW_BUCKETS) if i == 0 or max_rows > ROW_BUCKETS[i - 1]]
    choice = SkinnyChoice("cublas", "")
    start = time.perf_counter()
    with torch.inference_mode():
        for (name, n, k, _, normed), members in groups.items():
            for rows in buckets:
                key = (torch.cuda.get_device_name(param.device), str(param.dtype), name, n, k, normed, rows)
                if key not in _MEASURED:  # one measurement per process: every executor picks the same
                    _MEASURED[key] = _measure_group(members, rows, k, param)
                base, timed = _MEASURED[key]
                best_us, best = min(timed, key=lambda t: t[0]) if timed else (float("inf"), None)
                taken = best is not None and best_us < MARGIN * base
                if taken:
                    choice.kernel = "skinny"
                    for proj, _ in members:
                        proj.configs[rows] = best
                label = f"{name}{' (with its norm)' if normed else ''} [{n}x{k}] x{len(members)}"
                choice.lines.append(
                    f"{label}, {rows} rows: cuBLAS {base:.2f} us, {best.describe() if best else '-'} "
                    f"{best_us:.2f} us -> {'Triton' if taken else 'cuBLAS'}"
                )
    num = sum(bool(p.configs) for _, p, _ in projections)
    choice.reason = (
        f"{num} of {len(projections)} projections take the skinny-GEMM kernel at some row counts "
        f"(measured in {time.perf_counter() - start:.1f} s)"
    )
    for line in choice.lines:
        logger.info("skinny GEMM: %s", line)
    return choice


def _measure_group(members: list, rows: int, k: int, param: torch.Tensor) -> tuple[float, list]:
    """µs a call of the cuBLAS path (the norm kernel first where there is a norm) and of each of
    `MEASURED`'s configs, over every layer of a group at ``rows`` rows."""
    from ..layers.triton_kernels.skinny_gemm import MEASURED, skinny_gemm

    x = torch.randn(rows, k, dtype=param.dtype, device=param.device)  # [rows, K]
    res = torch.randn_like(x)

    def cublas(proj, norm):
        h = x if norm is None else norm.add_forward(x, res)[0]
        return F.linear(h, proj.weight, proj.bias)

    def triton_call(proj, norm, config):
        fused = None if norm is None else (res, norm.weight, norm.eps, norm.unit_offset)
        return skinny_gemm(x, proj.weight, proj.bias, config, fused)

    base = _graph_us([functools.partial(cublas, p, m) for p, m in members])
    timed = []
    for config in MEASURED:
        try:
            timed.append(
                (_graph_us([functools.partial(triton_call, p, m, config) for p, m in members]), config)
            )
        except Exception as exc:  # a config this GPU or Triton cannot build is no candidate
            logger.info("skinny GEMM: %s failed to run: %s", config.describe(), exc)
    return base, timed
