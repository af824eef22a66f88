"""Where one decode step's time goes: linear layers, attention, other ops, Python.

    python -m specexec.bench.profile_step [--dtype float32,bfloat16] [--cpu-linear blas,onednn] [--steps 16]
        [--output table.txt]

Four scenarios on the embedded SmolLM2 and extraction prompts (~1.3k tokens each): batch 1 and batch 8
without drafts, and with exactly 3 drafts per request (a drafter that always proposes 3 tokens, so every
step verifies 4 tokens per request). After the prompts are prefilled and two warm-up steps, each
scenario times ``--steps`` executor steps without the profiler (the wall time per step), then runs them
again under ``torch.profiler`` for the split:

- *linear*: ``aten::linear`` calls, oneDNN's packed linears (``cpu_linear``) and the quantized kernels
  (q/k/v/o, MLP, the LM head);
- *attention*: the paged attention function (cache write, gather, the attention kernel);
- *other ops*: every other top-level op inside the model call (norms, rotary, residual adds, embeddings);
- *Python in model*: the model call's time not inside any op (module dispatch, HF glue);
- *outside model*: everything in ``step()`` outside the model call — building inputs and attention
  metadata, drafting, grammar masks, sampling and verification, bookkeeping — split into its ops and
  its Python.

The profiler adds a few microseconds per op, so the split is in proportions; the wall column is the
unprofiled time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from ..drafters.base import Drafter, DraftProposal
from ..executor.config import ExecutorConfig
from ..executor.engine.request import Request
from ..executor.executor import Executor
from ..executor.layers.cpu_info import describe_cpu
from ..prompt_sets.datasets import load_dataset
from ..sampling import SamplingParams

STEP, MODEL, ATTENTION = "specexec::step", "specexec::model", "specexec::attention"
CATEGORIES = ("linear", "attention", "other ops", "Python in model", "outside: ops", "outside: Python")


class FixedDrafter(Drafter):
    """Proposes ``max_draft_len`` tokens every step (the last token repeated): a fixed verify shape."""

    runs_on_loop_thread = True

    def propose(self, request, num_slots: int, resources) -> DraftProposal:
        return DraftProposal([request.token_ids[-1]] * num_slots)


@dataclass(slots=True)
class Scenario:
    name: str
    batch: int
    num_drafts: int


SCENARIOS = (
    Scenario("batch 1, no drafts", 1, 0),
    Scenario("batch 1, k=3 drafts", 1, 3),
    Scenario("batch 8, no drafts", 8, 0),
    Scenario("batch 8, k=3 drafts", 8, 3),
)


def make_executor(
    dtype: str, scenario: Scenario, quantization: str | None = None, cpu_linear: str = "auto"
) -> Executor:
    config = ExecutorConfig(
        dtype=dtype,
        max_batch_size=scenario.batch,
        max_num_tokens=4096,
        quantization=quantization,
        cpu_linear=cpu_linear,
    )
    drafter = FixedDrafter(scenario.num_drafts) if scenario.num_drafts else None
    return Executor(config=config, drafter=drafter)


def start_requests(executor: Executor, scenario: Scenario, warmup_steps: int = 2) -> None:
    """Queue the scenario's requests and step until every one decodes (prefill done, warm-up steps)."""
    tokenizer = executor.tokenizer
    states = []
    for i, prompt in enumerate(load_dataset("extraction", scenario.batch)):
        ids = tokenizer.apply_chat_template(
            prompt.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        params = SamplingParams(max_tokens=10_000, ignore_eos=True)
        states.append(executor.add_request(Request(list(ids), params, f"p{i}")))
    while any(not s.num_output_tokens for s in states):
        executor.step()
    for _ in range(warmup_steps):
        executor.step()


def label_the_model(executor: Executor) -> None:
    """Wrap the model call and the attention function in profiler ranges (for the profiled run only)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from ..executor.model.paged_attention import PAGED_ATTENTION, paged_attention_forward

    model = executor.core.runner.model
    model_forward = model.forward

    def labelled_forward(*args, **kwargs):
        with torch.profiler.record_function(MODEL):
            return model_forward(*args, **kwargs)

    def labelled_attention(*args, **kwargs):
        with torch.profiler.record_function(ATTENTION):
            return paged_attention_forward(*args, **kwargs)

    model.forward = labelled_forward
    ALL_ATTENTION_FUNCTIONS[PAGED_ATTENTION] = labelled_attention


#: the linear layers' ops: dense (the BLAS, or oneDNN on packed weights: `executor/layers/packed_linear.py`), and
#: the weight-only quantized kernels (`executor/layers/quantized_linear.py`)
LINEAR_OPS = (
    "aten::linear",
    "mkldnn::_linear_pointwise",
    "aten::_weight_int8pack_mm",
    "aten::_weight_int4pack_mm_for_cpu",
)


def split(events) -> dict[str, float]:
    """Microseconds per category over the profiled steps (see the module docstring)."""
    labels = (STEP, MODEL, ATTENTION)
    totals: dict[str, float] = defaultdict(float)
    for e in events:
        if e.name in labels:
            totals[e.name] += e.cpu_time_total
            continue
        ancestors = []
        parent, is_top_level = e.cpu_parent, True
        while parent is not None:
            if parent.name in labels:
                ancestors.append(parent.name)
            else:
                is_top_level = False  # nested inside another op: counted with it
            parent = parent.cpu_parent
        if not is_top_level or STEP not in ancestors:
            continue
        if ATTENTION in ancestors:
            continue  # the attention range is counted whole
        if MODEL in ancestors:
            totals["linear" if e.name in LINEAR_OPS else "other ops"] += e.cpu_time_total
        else:
            totals["outside: ops"] += e.cpu_time_total
    totals["attention"] = totals[ATTENTION]
    totals["Python in model"] = totals[MODEL] - totals["linear"] - totals["attention"] - totals["other ops"]
    totals["outside: Python"] = totals[STEP] - totals[MODEL] - totals["outside: ops"]
    return totals


def profile_scenario(
    dtype: str, scenario: Scenario, num_steps: int, quantization: str | None = None, cpu_linear: str = "auto"
) -> dict[str, float]:
    executor = make_executor(dtype, scenario, quantization, cpu_linear)
    try:
        start_requests(executor, scenario)
        walls = []
        for _ in range(num_steps):
            start = time.perf_counter()
            executor.step()
            walls.append(time.perf_counter() - start)
        label_the_model(executor)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(num_steps):
                with torch.profiler.record_function(STEP):
                    executor.step()
        totals = split(prof.events())
        shares = {c: totals[c] / totals[STEP] for c in CATEGORIES}
        shares["wall ms"] = statistics.median(walls) * 1e3
        shares["model ms"] = totals[MODEL] / num_steps / 1e3
        shares["step ms (profiled)"] = totals[STEP] / num_steps / 1e3
        return shares
    finally:
        executor.close()


def format_table(rows: list[tuple[str, str, dict[str, float]]]) -> str:
    head = ["dtype", "scenario", "wall ms", *CATEGORIES]
    lines = ["  ".join(f"{h:>16}" for h in head)]
    for dtype, name, s in rows:
        cells = [dtype, name, f"{s['wall ms']:.1f}", *(f"{100 * s[c]:.1f}%" for c in CATEGORIES)]
        lines.append("  ".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specexec.bench.profile_step", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--dtype", default="float32,bfloat16", help="comma-separated (default both)")
    parser.add_argument("--steps", type=int, default=16, help="steps timed and profiled per scenario")
    parser.add_argument("--output", help="also write the table to this file")
    parser.add_argument("--quantization", choices=["int8", "int4", "gguf"], help="quantize the linear layers")
    parser.add_argument(
        "--cpu-linear", default="auto", help="comma-separated cpu_linear settings (auto, blas, onednn)"
    )
    args = parser.parse_args(argv)
    rows = []
    for dtype in args.dtype.split(","):
        for cpu_linear in args.cpu_linear.split(","):
            label = dtype if cpu_linear == "auto" else f"{dtype} {cpu_linear}"
            for scenario in SCENARIOS:
                shares = profile_scenario(dtype, scenario, args.steps, args.quantization, cpu_linear)
                rows.append((label, scenario.name, shares))
                print(f"{label} {scenario.name}: wall {shares['wall ms']:.1f} ms per step", flush=True)
    table = format_table(rows)
    header = (
        f"# profile_step: {describe_cpu()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {args.steps} steps per scenario"
    )
    print("\n" + header + "\n" + table)
    if args.output:
        with open(args.output, "w") as f:
            f.write(header + "\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
