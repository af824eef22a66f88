"""One batch-1 decode forward on CUDA, replayed alone: its GPU time, its kernels, and the step around it.

    python bench/reports/2026-11-27-gpu-own-decoder/replay_profile.py [--models smollm2,llama8b]
        [--model-impls transformers,specexec] [--max-tokens 64] [--device cuda]

For each model and forward (``model_impl``): an executor with CUDA graphs serves one Spec-Bench prompt
(warm-up), then again (timed: wall time over the target's forwards = ms a step). The graph its decode
steps replayed most is then launched alone: 200 replays between CUDA events (its GPU time), the host time
of one launch, and one profiled replay's kernels (count, and the ten that take longest in total). Last, the
host side of a whole step: torch's profiler over a 16-token request, ops by their own CPU time.
``--device cpu`` (eager replay, wall times, no kernel table) only checks the script.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from specexec.bench.graph_bench import (
    build_target,
    copy_bandwidth,
    describe_device,
    make_requests,
    weight_bytes,
)
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine_setup import capture_cuda_graphs
from specexec.executor.executor import Executor
from specexec.executor.model.cuda_graphs import EagerReplay
from specexec.executor.model.model_loader import load_model
from torch.profiler import ProfilerActivity, profile


def timed_replays(replay, repeats: int = 200) -> tuple[float, float]:
    """GPU ms of one replay (the mean of ``repeats`` back to back) and host ms of one launch."""
    for _ in range(20):
        replay()
    if not torch.cuda.is_available():  # --device cpu: wall time only
        start = time.perf_counter()
        for _ in range(repeats):
            replay()
        return 1e3 * (time.perf_counter() - start) / repeats, float("nan")
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = time.perf_counter()
    start.record()
    for _ in range(repeats):
        replay()
    end.record()
    host = (time.perf_counter() - host) / repeats
    end.synchronize()
    return start.elapsed_time(end) / repeats, 1e3 * host


def replay_kernels(replay) -> list[tuple[str, int, float]]:
    """(kernel, calls, total µs) of one profiled replay, longest first."""
    if not torch.cuda.is_available():
        return []
    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            calls, us = rows.get(e.name, (0, 0.0))
            rows[e.name] = (calls + 1, us + e.device_time)
    return sorted(((n, c, t) for n, (c, t) in rows.items()), key=lambda r: -r[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="smollm2,llama8b")
    parser.add_argument("--model-impls", default="transformers,specexec")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    loaded = load_model(None, dtype="float32", device="cpu", progress=False)
    tokenizer, vocab = loaded.tokenizer, loaded.model.config.vocab_size
    del loaded
    print(f"device: {describe_device(args.device)}")
    bandwidth = None
    for model_name in args.models.split(","):
        for impl in args.model_impls.split(","):
            module = build_target(model_name, vocab, torch.bfloat16, args.device)
            floor = ""
            if module is not None:
                bandwidth = bandwidth or copy_bandwidth(args.device)
                floor_ms = 1e3 * weight_bytes(module) / bandwidth
                floor = f"; floor {floor_ms:.2f} ms ({weight_bytes(module) / 1e9:.2f} GB / {bandwidth / 1e12:.2f} TB/s)"
            config = ExecutorConfig(
                device=args.device,
                model_impl=impl,
                max_batch_size=1,
                cuda_graphs=True,
                kv_cache_memory_gb=2.0,
            )
            ex = Executor(module, config, tokenizer=tokenizer if module is not None else None)
            if args.device == "cpu":  # eager replay stands in for the graphs
                core = ex.core
                core.graph_reports = capture_cuda_graphs(
                    config, core.runner, None, core.max_model_len, EagerReplay()
                )
            requests = make_requests(tokenizer, 1, 1, args.max_tokens, False)
            ex.run(requests)
            forwards = ex.speculation.stats.num_target_forwards
            if args.device != "cpu":
                torch.cuda.synchronize()
            start = time.perf_counter()
            ex.run(requests)
            step_ms = (
                1e3 * (time.perf_counter() - start) / (ex.speculation.stats.num_target_forwards - forwards)
            )
            graphs = ex.core.runner.graphs
            shape = max(graphs.stats.replays_by_shape, key=graphs.stats.replays_by_shape.get)
            replay = graphs.replay_of(shape)
            gpu_ms, host_ms = timed_replays(replay)
            kernels = replay_kernels(replay)
            print(f"\n== {model_name}, {ex.model_impl.impl} ({ex.model_impl.reason}){floor}")
            print(
                f"step {step_ms:.2f} ms (wall / target forwards, incl. the prefill); replay of {shape} alone: "
                f"{gpu_ms:.3f} ms on the GPU, {host_ms:.3f} ms to launch; "
                f"{sum(c for _, c, _ in kernels)} kernels, {sum(t for *_, t in kernels) / 1e3:.3f} ms of kernel time"
            )
            for name, calls, us in kernels[:10]:
                print(f"  {us:9.1f} us {calls:5d}x  {name[:110]}")
            short = make_requests(tokenizer, 1, 1, 16, False)
            ex.run(short)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                ex.run(short)
            print(
                prof.key_averages().table(
                    sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60
                )
            )
            ex.close()
            del ex, module, replay, graphs
            if args.device != "cpu":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
