"""CUDA graphs on against off, side by side in one process.

    python -m specexec.bench.graph_bench [--models smollm2,smollm2-random,tiny,llama8b]
        [--drafters none,ngram,eagle3] [--batches 1,8] [--graphs on,off] [--model-impls auto]
        [--max-tokens 64] [--num-prompts 8] [--device cuda] [--output graphs.json] [--tokenizer-dir DIR]

For each model, forward (``model_impl``), drafter and batch size one executor per ``--graphs`` setting
serves the same Spec-Bench prompts (greedy, ``ignore_eos``), in alternation: one warm-up pass each,
then ``--repeats`` timed passes each, the faster kept. A guided row per model and batch (NGram on the
extraction prompts) adds the mask wait. Columns: output tokens/s; the mean wall time of a step; graph
replays / eager forwards; acceptance length; the capture time and memory of every model's graphs; the
mask wait per guided step; the share of requests with the same tokens with graphs as without.

``smollm2`` is the embedded SmolLM2-135M-Instruct (EAGLE-3 uses its shipped head); ``smollm2-random``
its config with random weights (its step without drafts where the GGUF is not on the machine:
``--tokenizer-dir`` gives the tokenizer and config); ``tiny`` a random 2-layer Llama with SmolLM2's
vocabulary (launches are nearly all of a step); ``llama8b`` Llama-3-8B's shape (32 layers, hidden 4096,
32/8 heads, MLP 14336) with random weights built on the device and SmolLM2's vocabulary, whose rows
also give the weight bytes over the card's measured copy bandwidth (`copy_bandwidth`) and the step's
ratio to that floor. ``--device cpu``: eager replay stands in for the graphs (a check, not a speed).
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
from ..executor.executor import Executor
from ..executor.layers.cpu_info import describe_cpu
from ..executor.model.cuda_graphs import EagerReplay
from ..executor.model.model_loader import load_model
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
    model_impl: str  #: the forward that ran (`Executor.setup.model_impl`)
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
    floor_ms: float | None = None  #: the model's weight bytes over the measured copy bandwidth (llama8b)


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


def llama8b_model(vocab_size: int, dtype: torch.dtype, device: str):
    """Llama-3-8B's shape with random weights, built on ``device`` in ``dtype`` (no float32 copy)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval().requires_grad_(False)


def weight_bytes(model: torch.nn.Module) -> int:
    """The bytes a decode step reads: every parameter but the embedding tables (one row a token)."""
    embedded = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in embedded)


def copy_bandwidth(device: str, mib: int = 1024, repeats: int = 20) -> float:
    """Bytes read and written per second by a device-to-device copy of ``mib`` MiB (the best of
    ``repeats``)."""
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * src.numel() / best


def build_target(model_name: str, vocab: int, dtype: torch.dtype, device: str, config=None):
    """The module a bench model runs (None: the executor loads the embedded SmolLM2)."""
    if model_name == "smollm2-random":  # SmolLM2's own config, random weights: its step without drafts
        from transformers import LlamaForCausalLM

        torch.manual_seed(0)
        return LlamaForCausalLM(copy.deepcopy(config)).to(dtype).to(device).eval().requires_grad_(False)
    if model_name == "tiny":
        return tiny_model(vocab, dtype).to(device)
    if model_name == "llama8b":
        if device == "cpu":
            raise SystemExit("llama8b needs a GPU (its weights are 15 GB)")
        return llama8b_model(vocab, dtype, device)
    if model_name != "smollm2":
        raise SystemExit(f"unknown model {model_name!r}: smollm2, smollm2-random, tiny, llama8b")
    return None


def make_requests(tokenizer, num_prompts: int, batch: int, max_tokens: int, guided: bool) -> list[Request]:
    prompts = load_dataset("extraction" if guided else "specbench", max(num_prompts, batch))
    requests = []
    for i, p in enumerate(prompts):
        fmt = {"type": "json_schema", "json_schema": {"schema": p.schema}} if guided else None
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=not guided)
        requests.append(Request(p.messages, params, response_format=fmt, request_id=f"{i}"))
    return requests


class Setting:
    """One executor and its counters."""

    def __init__(
        self, args, impl: str, drafter: str, graphs: bool, guided: bool, target, share: bool
    ) -> None:
        model, tokenizer = target
        spec = SPECS["ngram" if guided else drafter]
        config = ExecutorConfig(
            dtype=args.dtype,
            device=args.device,
            model_impl=impl,
            max_batch_size=max(args.batches),
            kv_cache_memory_gb=args.kv_cache_gb,
            cuda_graphs=graphs and args.device != "cpu",
            speculative_config=spec,
            guided_unsupported="warn",
            drafter_timeout_s=None,
        )
        # each executor its own module, unless it is the only one (a 15 GB model is not copied)
        module = model if model is None or share else copy.deepcopy(model)
        self.executor = Executor(module, config, tokenizer=tokenizer if module is not None else None)
        if graphs and args.device == "cpu":
            self.executor.capture_forwards(EagerReplay())
        self.graphs = graphs
        self.tokens: dict[str, list[int]] = {}

    def run(self, requests: list[Request], batch: int) -> dict:
        """Serve ``requests`` ``batch`` at a time; wall time and counters of the pass."""
        ex = self.executor
        stats, guided = ex.speculation.stats, ex.guided.stats
        graphs = ex.model_runner.graphs
        before = (stats.num_target_forwards, guided.mask_wait_ms, guided.num_steps)
        replays_before = (graphs.stats.num_replays, graphs.stats.num_eager) if graphs else (0, 0)
        if ex.model_runner.device.type == "cuda":
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
        reports = self.executor.setup.cuda_graphs
        return Row(
            model,
            self.executor.setup.model_impl.impl,
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


def compare(args, model_name: str, impl: str, drafter: str, batch: int, guided: bool, target) -> list[Row]:
    share = len(args.graphs) == 1
    settings = [Setting(args, impl, drafter, graphs, guided, target, share) for graphs in args.graphs]
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
    if len(settings) == 2:
        on, off = settings
        same = sum(on.tokens[k] == off.tokens[k] for k in on.tokens) / max(1, len(on.tokens))
        for row in rows:
            row.same_tokens = same
    for s in settings:
        s.executor.close()
    return rows


def format_table(rows: list[Row]) -> str:
    head = (
        f"{'model':8} {'impl':12} {'drafter':8} {'b':>2} {'guided':6} {'graphs':6} {'tok/s':>8} "
        f"{'step ms':>8} {'replay/eager':>12} {'acc.len':>7} {'capture s':>9} {'MiB':>6} {'mask wait ms':>12} "
        f"{'same':>5} {'on/off':>6} {'floor ms':>8} {'/floor':>6}"
    )
    lines = [head, "-" * len(head)]
    speed = {(r.model, r.model_impl, r.drafter, r.batch, r.guided, r.graphs): r.tokens_per_s for r in rows}
    for r in rows:
        off = speed.get((r.model, r.model_impl, r.drafter, r.batch, r.guided, False))
        ratio = f"{r.tokens_per_s / off:.2f}x" if r.graphs and off else ""
        acc = f"{r.acceptance_length:.2f}" if r.acceptance_length else "-"
        wait = f"{r.mask_wait_ms:.2f}" if r.mask_wait_ms is not None else "-"
        same = f"{r.same_tokens:5.0%}" if r.same_tokens is not None else "-"
        floor = f"{r.floor_ms:8.2f} {r.step_ms / r.floor_ms:5.2f}x" if r.floor_ms else f"{'-':>8} {'-':>6}"
        lines.append(
            f"{r.model:8} {r.model_impl:12} {r.drafter:8} {r.batch:>2} {'yes' if r.guided else 'no':6} "
            f"{'on' if r.graphs else 'off':6} {r.tokens_per_s:8.1f} {r.step_ms:8.2f} "
            f"{f'{r.replays}/{r.eager}':>12} {acc:>7} {r.capture_s:9.2f} {r.capture_mib:6.0f} {wait:>12} "
            f"{same:>5} {ratio:>6} {floor}"
        )
    return "\n".join(lines)


def smollm2_tokenizer_and_config(directory: str | None):
    """SmolLM2's tokenizer and transformers config: from the embedded GGUF, or from ``directory``."""
    from transformers import AutoConfig, AutoTokenizer

    if (
        directory is not None
    ):  # (a machine without the GGUF: smollm2-random, tiny and llama8b need only these)
        return AutoTokenizer.from_pretrained(directory), AutoConfig.from_pretrained(directory)
    loaded = load_model(None, dtype="float32", device="cpu", progress=False)
    return loaded.tokenizer, loaded.model.config


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
    parser.add_argument("--graphs", default="on,off", help="the cuda_graphs settings to run: on, off or both")
    parser.add_argument("--model-impls", default="auto", help="model_impl values, each its own rows")
    parser.add_argument("--kv-cache-gb", type=float, default=1.0, help="each executor's KV pool (GiB)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--no-guided", action="store_true", help="skip the guided NGram rows")
    parser.add_argument("--output", default=None, help="write the rows as JSON here")
    parser.add_argument(
        "--tokenizer-dir", help="SmolLM2's tokenizer and config (save_pretrained), not the GGUF"
    )
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    graph_settings = {"on": True, "off": False}
    if not set(args.graphs.split(",")) <= set(graph_settings):
        parser.error(f"--graphs: on, off or on,off; got {args.graphs!r}")
    args.graphs = [graph_settings[g] for g in args.graphs.split(",")]
    if args.device != "cpu" and not torch.cuda.is_available():
        print(
            "no CUDA device: run with --device cpu (eager replay stands in for the graphs)", file=sys.stderr
        )
        return 2
    tokenizer, smollm2_config = smollm2_tokenizer_and_config(args.tokenizer_dir)
    vocab = smollm2_config.vocab_size
    dtype = torch.bfloat16 if args.device != "cpu" else torch.float32
    rows: list[Row] = []
    print(f"device: {describe_device(args.device)}", file=sys.stderr)
    bandwidth, notes = None, []
    for model_name in args.models.split(","):
        drafters = [d for d in args.drafters.split(",") if not (d == "eagle3" and model_name != "smollm2")]
        if model_name == "smollm2" and args.tokenizer_dir is not None:
            raise SystemExit("smollm2 loads the embedded GGUF: with --tokenizer-dir, run smollm2-random")
        for impl in args.model_impls.split(","):
            module = build_target(
                model_name, vocab, dtype, args.device, smollm2_config
            )  # fresh: an executor converts it
            floor_ms = None
            if model_name == "llama8b":
                bandwidth = bandwidth or copy_bandwidth(args.device)
                floor_ms = 1e3 * weight_bytes(module) / bandwidth
                notes.append(
                    f"llama8b: {weight_bytes(module) / 1e9:.2f} GB of weights; copy bandwidth "
                    f"{bandwidth / 1e12:.2f} TB/s (read + written); floor {floor_ms:.2f} ms"
                )
                print(notes[-1], file=sys.stderr)
            for batch in args.batches:
                cases = [(d, False) for d in drafters] + ([] if args.no_guided else [("ngram", True)])
                for drafter, guided in cases:
                    new = compare(args, model_name, impl, drafter, batch, guided, (module, tokenizer))
                    for row in new:
                        row.floor_ms = floor_ms if batch == 1 else None
                    rows += new
                    print("\n".join(format_table(new).splitlines()[2:]), file=sys.stderr)
            del module
            if args.device != "cpu":
                torch.cuda.empty_cache()
    print(f"device: {describe_device(args.device)}")
    print("\n".join(notes + [format_table(rows)]))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(
                {"device": describe_device(args.device), "notes": notes, "rows": [asdict(r) for r in rows]},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
