"""CUDA graphs on against off, side by side in one process.

    python -m specexec.bench.graph_bench [--models smollm2,tiny] [--drafters none,ngram,eagle3]
        [--batches 1,8] [--max-tokens 64] [--num-prompts 8] [--device cuda] [--output graphs.json]

For each model, drafter and batch size two executors, ``cuda_graphs: true`` and ``false``, serve the
same Spec-Bench prompts (greedy, ``ignore_eos``, the same token budget), in alternation: one warm-up
pass each, then ``--repeats`` timed passes each, the faster kept. A guided row per model and batch (NGram
on the extraction prompts with their schemas) adds the mask wait. Columns: output tokens/s; the mean wall
time of a step; how the target's forwards ran (graph replays / eager: prefill chunks and anything larger
than every captured shape run eagerly); acceptance length; the capture time and memory of every model's
graphs; the mask wait per guided step; and the share of requests whose tokens are the same with graphs
as without (on real weights in bfloat16, padded shapes may round differently near a tie).

``smollm2`` is the embedded SmolLM2-135M-Instruct (EAGLE-3 uses its shipped head); ``tiny`` is a random
2-layer Llama with SmolLM2's vocabulary, where launches are nearly all of a step's time. With ``--device
cpu`` the eager-replay backend stands in for the graphs (the captured path launched eagerly): that checks
the script and the path, it is not a speed figure.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import asdict, dataclass

import torch

from ..executor.config import ExecutorConfig
from ..executor.engine.request import Request
from ..executor.engine_setup import capture_cuda_graphs
from ..executor.executor import Executor
from ..executor.layers.cpu_info import describe_cpu
from ..executor.model.cuda_graphs import EagerReplay
from ..prompt_sets.datasets import load_dataset
from ..sampling import SamplingParams

SPECS = {
    "none": None,
    "ngram": {"decoding_type": "NGram", "max_draft_len": 3},
    "eagle3": {"decoding_type": "Eagle", "max_draft_len": 3},
}


@dataclass(slots=True)
class Row:
    model: str
    drafter: str
    batch: int
    guided: bool
    graphs: bool
    tokens_per_s: float
    step_ms: float
    replays: int
    eager: int
    acceptance_length: float | None
    capture_s: float
    capture_mib: float
    mask_wait_ms: float | None
    same_tokens: float | None = None  #: share of requests with the same tokens as the other setting


def tiny_model(vocab_size: int, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(dtype).eval().requires_grad_(False)


def make_requests(tokenizer, num_prompts: int, batch: int, max_tokens: int, guided: bool) -> list[Request]:
    prompts = load_dataset("extraction" if guided else "specbench", num_prompts)
    requests = []
    for i, p in enumerate(prompts):
        fmt = {"type": "json_schema", "json_schema": {"schema": p.schema}} if guided else None
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=not guided)
        requests.append(Request(p.messages, params, response_format=fmt, request_id=f"{i}"))
    return requests


class Setting:
    """One executor and its counters."""

    def __init__(self, args, model_name: str, drafter: str, graphs: bool, guided: bool, target) -> None:
        model, tokenizer = target
        spec = SPECS["ngram" if guided else drafter]
        config = ExecutorConfig(
            dtype=args.dtype,
            device=args.device,
            max_batch_size=max(args.batches),
            cuda_graphs=graphs and args.device != "cpu",
            speculative_config=spec,
            guided_unsupported="warn",
            drafter_timeout_s=None,
        )
        module = copy.deepcopy(model) if model_name == "tiny" else None  # each executor its own
        self.executor = Executor(module, config, tokenizer=tokenizer if module is not None else None)
        core = self.executor.core
        if graphs and args.device == "cpu":
            drafter_obj = self.executor.speculation.drafter
            core.graph_reports = capture_cuda_graphs(
                config, core.runner, drafter_obj, core.max_model_len, EagerReplay()
            )
        self.graphs = graphs
        self.tokens: dict[str, list[int]] = {}

    def run(self, requests: list[Request], batch: int) -> dict:
        """Serve ``requests`` ``batch`` at a time; wall time and counters of the pass."""
        ex = self.executor
        stats, guided = ex.speculation.stats, ex.guided.stats
        graphs = ex.core.runner.graphs
        before = (stats.num_target_forwards, guided.mask_wait_ms, guided.num_steps)
        replays_before = (graphs.stats.num_replays, graphs.stats.num_eager) if graphs else (0, 0)
        if ex.core.runner.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        outputs = []
        for i in range(0, len(requests), batch):
            outputs += ex.run(requests[i : i + batch])
        elapsed = time.perf_counter() - start
        for out in outputs:
            self.tokens[out.request_id] = out.token_ids
        replays = (graphs.stats.num_replays, graphs.stats.num_eager) if graphs else (0, 0)
        steps = stats.num_target_forwards - before[0]
        decode_steps = sum(o.metrics.num_decode_steps for o in outputs)
        accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
        return {
            "seconds": elapsed,
            "tokens": sum(len(o.token_ids) for o in outputs),
            "steps": steps,
            "replays": replays[0] - replays_before[0],
            "eager": replays[1] - replays_before[1],
            "acceptance_length": (
                1 + accepted / decode_steps
                if decode_steps and any(o.metrics.num_draft_tokens for o in outputs)
                else None
            ),
            "mask_wait_ms": (
                (guided.mask_wait_ms - before[1]) / (guided.num_steps - before[2])
                if guided.num_steps > before[2]
                else None
            ),
        }

    def row(self, model: str, drafter: str, batch: int, guided: bool, best: dict) -> Row:
        reports = self.executor.cuda_graphs
        return Row(
            model,
            "ngram" if guided else drafter,
            batch,
            guided,
            self.graphs,
            best["tokens"] / best["seconds"],
            1e3 * best["seconds"] / max(1, best["steps"]),
            best["replays"],
            best["eager"],
            best["acceptance_length"],
            sum(r.seconds for r in reports),
            sum(r.memory_bytes for r in reports) / 2**20,
            best["mask_wait_ms"],
        )


def compare(args, model_name: str, drafter: str, batch: int, guided: bool, target) -> list[Row]:
    settings = [Setting(args, model_name, drafter, graphs, guided, target) for graphs in (True, False)]
    requests = make_requests(target[1], args.num_prompts, batch, args.max_tokens, guided)
    for s in settings:
        s.run(requests, batch)  # warm-up pass
    passes: list[list[dict]] = [[], []]
    for _ in range(args.repeats):
        for i, s in enumerate(settings):
            passes[i].append(s.run(requests, batch))
    rows = []
    for s, runs in zip(settings, passes):
        rows.append(
            s.row(model_name, drafter, batch, guided, max(runs, key=lambda r: r["tokens"] / r["seconds"]))
        )
    on, off = settings
    same = sum(on.tokens[k] == off.tokens[k] for k in on.tokens) / max(1, len(on.tokens))
    for row in rows:
        row.same_tokens = same
    for s in settings:
        s.executor.close()
    return rows


def format_table(rows: list[Row]) -> str:
    head = (
        f"{'model':8} {'drafter':8} {'b':>2} {'guided':6} {'graphs':6} {'tok/s':>8} {'step ms':>8} "
        f"{'replay/eager':>12} {'acc.len':>7} {'capture s':>9} {'MiB':>6} {'mask wait ms':>12} {'same':>5} "
        f"{'on/off':>6}"
    )
    lines = [head, "-" * len(head)]
    speed = {(r.model, r.drafter, r.batch, r.guided, r.graphs): r.tokens_per_s for r in rows}
    for r in rows:
        off = speed.get((r.model, r.drafter, r.batch, r.guided, False))
        ratio = f"{r.tokens_per_s / off:.2f}x" if r.graphs and off else ""
        acc = f"{r.acceptance_length:.2f}" if r.acceptance_length else "-"
        wait = f"{r.mask_wait_ms:.2f}" if r.mask_wait_ms is not None else "-"
        lines.append(
            f"{r.model:8} {r.drafter:8} {r.batch:>2} {'yes' if r.guided else 'no':6} "
            f"{'on' if r.graphs else 'off':6} {r.tokens_per_s:8.1f} {r.step_ms:8.2f} "
            f"{f'{r.replays}/{r.eager}':>12} {acc:>7} {r.capture_s:9.2f} {r.capture_mib:6.0f} {wait:>12} "
            f"{r.same_tokens:5.0%} {ratio:>6}"
        )
    return "\n".join(lines)


def describe_device(device: str) -> str:
    if device != "cpu" and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"{describe_cpu()} (torch {torch.__version__}, {torch.get_num_threads()} threads; eager replay)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specexec.bench.graph_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--models", default="smollm2,tiny")
    parser.add_argument("--drafters", default="none,ngram,eagle3")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--no-guided", action="store_true", help="skip the guided NGram rows")
    parser.add_argument("--output", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.device != "cpu" and not torch.cuda.is_available():
        print(
            "no CUDA device: run with --device cpu (eager replay stands in for the graphs)", file=sys.stderr
        )
        return 2
    from ..executor.model.model_loader import load_model

    loaded = load_model(None, dtype="float32", device="cpu", progress=False)
    tokenizer = loaded.tokenizer
    vocab = loaded.model.config.vocab_size
    del loaded
    dtype = torch.bfloat16 if args.device != "cpu" else torch.float32
    rows: list[Row] = []
    print(f"device: {describe_device(args.device)}", file=sys.stderr)
    for model_name in args.models.split(","):
        target = (tiny_model(vocab, dtype).to(args.device) if model_name == "tiny" else None, tokenizer)
        drafters = [d for d in args.drafters.split(",") if not (d == "eagle3" and model_name == "tiny")]
        for batch in args.batches:
            cases = [(d, False) for d in drafters] + ([] if args.no_guided else [("ngram", True)])
            for drafter, guided in cases:
                rows += compare(args, model_name, drafter, batch, guided, target)
                print("\n".join(format_table(rows[-2:]).splitlines()[2:]), file=sys.stderr)
    print(f"device: {describe_device(args.device)}")
    print(format_table(rows))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(
                {"device": describe_device(args.device), "rows": [asdict(r) for r in rows]}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
