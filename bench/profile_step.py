"""Where one decode step's time goes: linear layers, attention, other ops, Python.

    python -m specexec.bench.profile_step [--dtype float32,bfloat16] [--cpu-linear blas,onednn] [--steps 16]
        [--model-impl transformers,specexec] [--output table.txt]

Five scenarios on the embedded SmolLM2 and extraction prompts (~1.3k tokens each): batch 1, 4 and 8
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

Under the split, for the batch-1 decode step of each setting, the ops of one decoder layer (layer 0):
each op's calls and microseconds per step, and the layer's Python (its time outside those ops).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
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
LAYER = "specexec::layer0"  #: one decoder layer, for the per-op table
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
    Scenario("batch 4, no drafts", 4, 0),
    Scenario("batch 8, no drafts", 8, 0),
    Scenario("batch 8, k=3 drafts", 8, 3),
)


def make_executor(
    dtype: str,
    scenario: Scenario,
    quantization: str | None = None,
    cpu_linear: str = "auto",
    model_impl: str = "auto",
) -> Executor:
    config = ExecutorConfig(
        dtype=dtype,
        max_batch_size=scenario.batch,
        max_num_tokens=4096,
        quantization=quantization,
        cpu_linear=cpu_linear,
        model_impl=model_impl,
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


@contextlib.contextmanager
def label_the_model(executor: Executor) -> Iterator[None]:
    """Wrap the model call, the attention function and layer 0 in profiler ranges while profiling:
    transformers' modules reach attention through its attention-function table, the own decoder's
    layers through `paged_attention`."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from ..executor.model import paged_attention as paged
    from ..executor.model.decoder import forward as own_forward
    from ..executor.model.decoder import layers as own_layers

    runner = executor.model_runner
    layer = runner.model.model.layers[0]
    own_attention, layer_forward = own_layers.paged_attention, layer.forward
    run_fused = own_forward.run_fused  # the own decoder's layer as one C++ op (`decoder/fused_layer.py`)
    # registered once a model runs on transformers' modules (absent where only the own decoder ran)
    hf_attention = ALL_ATTENTION_FUNCTIONS.get(paged.PAGED_ATTENTION)

    def labelled(label, fn):
        def call(*args, **kwargs):
            with torch.profiler.record_function(label):
                return fn(*args, **kwargs)

        return call

    def fused(fused_layer, *args, **kwargs):
        if fused_layer is not layer:
            return run_fused(fused_layer, *args, **kwargs)
        with torch.profiler.record_function(LAYER):
            return run_fused(fused_layer, *args, **kwargs)

    layer.forward = labelled(LAYER, layer_forward)
    own_forward.run_fused = fused
    if hf_attention is not None:
        ALL_ATTENTION_FUNCTIONS[paged.PAGED_ATTENTION] = labelled(ATTENTION, hf_attention)
    own_layers.paged_attention = labelled(ATTENTION, own_attention)
    try:
        with runner.wrapped_forward(lambda forward: labelled(MODEL, forward)):
            yield
    finally:
        del layer.forward
        own_forward.run_fused = run_fused
        if hf_attention is not None:
            ALL_ATTENTION_FUNCTIONS[paged.PAGED_ATTENTION] = hf_attention
        own_layers.paged_attention = own_attention


#: the linear layers' ops: dense (the BLAS, or oneDNN on packed weights: `executor/layers/packed_linear.py`),
#: the weight-only quantized kernels (`executor/layers/quantized/quantized_linear.py`) and the int8_dot ones
LINEAR_OPS = (
    "aten::linear",
    "mkldnn::_linear_pointwise",
    "aten::_weight_int8pack_mm",
    "aten::_weight_int4pack_mm_for_cpu",
    "specexec_cpu::q4_linear",
    "specexec_cpu::q8_linear",
)
#: attention ops reached without the attention range: the C++ layer op calls its kernel directly
ATTENTION_OPS = ("specexec_cpu::paged_attention_short",)
STACK_OP = "specexec_cpu::prenorm_stack"  #: every decoder layer as one C++ op (`decoder/fused_layer.py`)
#: ops that only call others (the C++ decoder layer, `prenorm_layer_cpu.cpp`): their children are split as
#: if called from Python, their own time (the glue between the calls) counts as "other ops"
CONTAINER_OPS = ("specexec_cpu::prenorm_layer", STACK_OP)


LABELS = (STEP, MODEL, ATTENTION, LAYER)


def _ancestors(event) -> tuple[list[str], bool]:
    """The labelled ranges an event lies in, and whether it is a top-level op (inside no other op)."""
    ancestors = []
    parent, is_top_level = event.cpu_parent, True
    while parent is not None:
        if parent.name in LABELS:
            ancestors.append(parent.name)
        elif parent.name not in CONTAINER_OPS:
            is_top_level = False  # nested inside another op: counted with it
        parent = parent.cpu_parent
    return ancestors, is_top_level


def split(events) -> dict[str, float]:
    """Microseconds per category over the profiled steps (see the module docstring)."""
    totals: dict[str, float] = defaultdict(float)
    for e in events:
        if e.name in (STEP, MODEL, ATTENTION):
            totals[e.name] += e.cpu_time_total
            continue
        if e.name == LAYER:
            continue
        ancestors, is_top_level = _ancestors(e)
        if not is_top_level or STEP not in ancestors:
            continue
        if ATTENTION in ancestors:
            continue  # the attention range is counted whole
        if MODEL in ancestors:
            totals[_category(e)] += _own_time(e)
        else:
            totals["outside: ops"] += e.cpu_time_total
    totals["attention"] += totals[ATTENTION]
    totals["Python in model"] = totals[MODEL] - totals["linear"] - totals["attention"] - totals["other ops"]
    totals["outside: Python"] = totals[STEP] - totals[MODEL] - totals["outside: ops"]
    return totals


def _category(event) -> str:
    if event.name in LINEAR_OPS:
        return "linear"
    return "attention" if event.name in ATTENTION_OPS else "other ops"


def _own_time(event) -> float:
    """An op's time; a container op's without its children's (they are counted apart)."""
    if event.name not in CONTAINER_OPS:
        return event.cpu_time_total
    return event.cpu_time_total - sum(child.cpu_time_total for child in event.cpu_children)


def layer_ops(events, num_steps: int, num_layers: int) -> list[tuple[str, float, float]]:
    """(op, calls per step, microseconds per step) of the top-level ops inside layer 0 (the attention
    range as one op), slowest first, and last the layer's Python: its time outside those ops. Where the
    layers ran as one op (`STACK_OP`), no layer is apart: its ops' calls and times over ``num_layers``
    instead, an average layer, and the stack op's own time among them."""
    calls: dict[str, float] = defaultdict(float)
    micros: dict[str, float] = defaultdict(float)
    stacked = [e for e in events if e.name == STACK_OP]
    if stacked:
        for e in stacked:
            for op in (e, *e.cpu_children):
                calls[op.name] += 1 / num_layers
                micros[op.name] += _own_time(op) / num_layers
        rows = sorted(((n, calls[n] / num_steps, micros[n] / num_steps) for n in calls), key=lambda r: -r[2])
        return [*rows, ("Python in the layer", float("nan"), 0.0)]
    layer_total = 0.0
    for e in events:
        if e.name == LAYER:
            layer_total += e.cpu_time_total
            continue
        ancestors, is_top_level = _ancestors(e)
        if not ancestors or ancestors[0] != LAYER or not (is_top_level or e.name == ATTENTION):
            continue  # (an op inside the attention range is counted with the range)
        calls[e.name] += 1
        micros[e.name] += _own_time(e)
    rows = sorted(((n, calls[n] / num_steps, micros[n] / num_steps) for n in calls), key=lambda r: -r[2])
    rows.append(("Python in the layer", float("nan"), (layer_total - sum(micros.values())) / num_steps))
    return rows


def format_layer_ops(label: str, rows: list[tuple[str, float, float]]) -> str:
    lines = [
        f"# layer 0 of a batch-1 decode step, {label} (the average layer where every layer ran in one op):"
        " op, calls and microseconds per step"
    ]
    lines += [f"{name:>40}  {n:>6.3g}  {us:>9.1f}" for name, n, us in rows]
    total = sum(us for *_, us in rows)
    lines.append(f"{'the whole layer':>40}  {'':>6}  {total:>9.1f}")
    return "\n".join(lines)


def profile_scenario(
    dtype: str,
    scenario: Scenario,
    num_steps: int,
    quantization: str | None = None,
    cpu_linear: str = "auto",
    model_impl: str = "auto",
) -> tuple[dict[str, float], list[tuple[str, float, float]]]:
    """The scenario's split (shares of the step, and the wall time) and its layer-0 op table."""
    executor = make_executor(dtype, scenario, quantization, cpu_linear, model_impl)
    try:
        start_requests(executor, scenario)
        walls = []
        for _ in range(num_steps):
            start = time.perf_counter()
            executor.step()
            walls.append(time.perf_counter() - start)
        with (
            label_the_model(executor),
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
        ):
            for _ in range(num_steps):
                with torch.profiler.record_function(STEP):
                    executor.step()
        events = prof.events()
        totals = split(events)
        shares = {c: totals[c] / totals[STEP] for c in CATEGORIES}
        shares["wall ms"] = statistics.median(walls) * 1e3
        shares["model ms"] = totals[MODEL] / num_steps / 1e3
        shares["step ms (profiled)"] = totals[STEP] / num_steps / 1e3
        num_layers = len(executor.model.model.layers)
        return shares, layer_ops(events, num_steps, num_layers)
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
    parser.add_argument(
        "--model-impl",
        default="auto",
        help="comma-separated model_impl settings (auto, specexec, transformers)",
    )
    args = parser.parse_args(argv)
    rows, layer_tables = [], []
    for dtype in args.dtype.split(","):
        for cpu_linear in args.cpu_linear.split(","):
            for impl in args.model_impl.split(","):
                label = " ".join([dtype] + [x for x in (cpu_linear, impl) if x != "auto"])
                for scenario in SCENARIOS:
                    shares, ops = profile_scenario(
                        dtype, scenario, args.steps, args.quantization, cpu_linear, impl
                    )
                    rows.append((label, scenario.name, shares))
                    print(f"{label} {scenario.name}: wall {shares['wall ms']:.1f} ms per step", flush=True)
                    if scenario.batch == 1 and not scenario.num_drafts:
                        layer_tables.append(format_layer_ops(label, ops))
    table = format_table(rows) + "\n\n" + "\n\n".join(layer_tables)
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
