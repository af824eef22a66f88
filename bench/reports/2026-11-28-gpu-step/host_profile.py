"""Where a batch-1 decode step's time goes on CUDA with graphs: the replay on the GPU, and the host.

    python bench/reports/2026-11-28-gpu-step/host_profile.py --tokenizer-dir DIR [--max-tokens 128]
        [--model smollm2-random] [--device cuda]

One executor (CUDA graphs, batch 1, no drafts) serves one Spec-Bench prompt (warm-up), then:
1. timed: wall time over the target's forwards (ms a step);
2. the decode graph replayed alone: its GPU time (200 replays between CUDA events);
3. each stage of `EngineCore.step` timed on the host (no synchronisation added: the stage that reads
   the step's answer back also waits there for the GPU), and the caller's loop around `step`;
4. cProfile over one more run: the functions with the most own time;
5. torch's profiler over one more run: the ops launched outside the graph, per step.
``--device cpu`` (eager replay) only checks the script.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections import defaultdict

import torch
from specexec.bench.graph_bench import (
    build_target,
    describe_device,
    make_requests,
    smollm2_tokenizer_and_config,
)
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.engine_core import EngineCore
from specexec.executor.engine_setup import capture_cuda_graphs
from specexec.executor.executor import Executor
from specexec.executor.model.cuda_graphs import EagerReplay
from torch.profiler import ProfilerActivity, profile

STAGES = (
    "_admit_submitted", "_prepare_draft_requests", "_schedule", "_prepare_draft_tokens", "_forward",
    "_wait_for_masks", "_apply_penalties", "_apply_masks", "_sample", "_compute_logprobs",
    "_keep_hidden_states", "_update_requests", "_free_resources", "_release_finished", "step",
)  # fmt: skip


def timed_replays(replay, repeats: int = 200) -> float:
    for _ in range(20):
        replay()
    if not torch.cuda.is_available():
        start = time.perf_counter()
        for _ in range(repeats):
            replay()
        return 1e3 * (time.perf_counter() - start) / repeats
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def stage_timers(core: EngineCore) -> dict[str, list[float]]:
    """Wrap each stage of ``core`` (on the instance) with a host timer."""
    times: dict[str, list[float]] = defaultdict(list)
    for name in STAGES:
        fn = getattr(core, name)

        def timed(*a, _fn=fn, _name=name, **k):
            start = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                times[_name].append(time.perf_counter() - start)

        setattr(core, name, timed)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-random")
    parser.add_argument("--tokenizer-dir", default=None)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    tokenizer, config = smollm2_tokenizer_and_config(args.tokenizer_dir)
    dtype = torch.bfloat16 if args.device != "cpu" else torch.float32
    module = build_target(args.model, config.vocab_size, dtype, args.device, config)
    ex_config = ExecutorConfig(
        device=args.device, max_batch_size=1, cuda_graphs=args.device != "cpu", progress=False,
        drafter_timeout_s=None,
    )  # fmt: skip
    ex = Executor(module, ex_config, tokenizer=tokenizer)
    core = ex.core
    if args.device == "cpu":
        core.graph_reports = capture_cuda_graphs(
            ex_config, core.runner, None, core.max_model_len, EagerReplay()
        )
    print(f"device: {describe_device(args.device)}; model {args.model}, forward {ex.model_impl.impl}")
    skinny = getattr(core, "skinny_kernels", None)  # (None: the code before the skinny GEMM)
    if skinny is not None:
        print(f"skinny GEMM: {skinny.kernel}: {skinny.reason}")
        print("\n".join(f"   {line}" for line in skinny.lines))
    requests = make_requests(tokenizer, 1, 1, args.max_tokens, False)
    ex.run(requests)  # warm-up
    stats = core.speculation.stats

    def run_once() -> tuple[float, int]:
        steps = stats.num_target_forwards
        start = time.perf_counter()
        ex.run(make_requests(tokenizer, 1, 1, args.max_tokens, False))
        return time.perf_counter() - start, stats.num_target_forwards - steps

    wall, steps = run_once()
    print(f"1. {1e3 * wall / steps:.3f} ms a step ({steps} steps, {args.max_tokens} tokens)")
    graphs = core.runner.graphs
    if graphs is not None and graphs.stats.replays_by_shape:
        shape = max(graphs.stats.replays_by_shape, key=graphs.stats.replays_by_shape.get)
        print(f"2. replay alone ({shape}): {timed_replays(graphs.replay_of(shape)):.3f} ms on the GPU")
    times = stage_timers(core)
    wall, steps = run_once()
    print(f"3. stages, us a step (run: {1e3 * wall / steps:.3f} ms a step; {steps} steps)")
    inside = 0.0
    for name in STAGES:
        total = sum(times[name])
        if name != "step":
            inside += total
        print(f"   {name:24} {1e6 * total / steps:8.1f} us  ({len(times[name])} calls)")
    step_total = sum(times["step"])
    print(f"   {'(step, not in a stage)':24} {1e6 * (step_total - inside) / steps:8.1f} us")
    print(f"   {'(outside step)':24} {1e6 * (wall - step_total) / steps:8.1f} us")
    for name in STAGES:
        setattr(core, name, getattr(EngineCore, name).__get__(core))
    profiler = cProfile.Profile()
    profiler.enable()
    wall, steps = run_once()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(45)
    print(f"4. cProfile ({1e3 * wall / steps:.3f} ms a step under it; {steps} steps)")
    print("\n".join(out.getvalue().splitlines()[:70]))
    activities = [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        wall, steps = run_once()
    print(f"5. torch ops on the host, per step ({steps} steps)")
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
    print(table)
    ex.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
