"""Soak: many mixed requests through one executor, from two threads, in many calls.

    python -m specexec.bench.soak [--requests 1000] [--max-tokens 32] [--batch 10] [--device cuda]

A tiny random Llama (float32, SmolLM2's tokenizer and vocabulary, NGram drafts) takes requests of
every kind: greedy, sampled, guided by a JSONSchemaBench schema or a regex, aborted (a stream closed
early, or `abort_request` from the other thread), and bad (empty, out of the vocabulary, max_tokens 0,
a grammar that admits nothing, a malformed schema, an unenforceable keyword). After every call it
prints the KV pages held (the other thread's requests may hold some) and the process RSS. It passes
(exit 0) when no page is held at the end, no call raised, every finished guided output was marked
valid, and RSS grew by under ``--max-rss-growth-mb`` between request ``--warmup`` and the last (on
CUDA, the GPU memory allocated by torch too).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import threading
import time
from dataclasses import dataclass, field

from ..executor.config import ExecutorConfig
from ..executor.engine.request import FinishReason, Request
from ..executor.executor import Executor
from ..prompt_sets.datasets import DATA_DIR
from ..sampling import SamplingParams

KINDS = ("greedy", "sampled", "json", "regex", "aborted", "bad")
WEIGHTS = (35, 20, 20, 5, 10, 10)
BAD_REQUESTS = (
    ("empty prompt", "", None, 8),
    ("out of the vocabulary", [5, 10**6], None, 8),
    ("max_tokens 0", "hello", None, 0),
    ("grammar admits nothing", "hello", {"type": "regex", "regex": "[^\\x00-\\U0010FFFF]"}, 8),
    ("malformed schema", "hello", {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}, 8),
    (
        "unenforceable keyword",
        "hello",
        {"type": "json_schema", "json_schema": {"schema": {"type": "array", "uniqueItems": True}}},
        8,
    ),
)


def rss_mb() -> float:
    """Resident set size now (Linux /proc), in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def gpu_mb() -> float:
    """GPU memory torch holds in tensors now (0 without CUDA), in MB."""
    import torch

    return torch.cuda.memory_allocated() / 2**20 if torch.cuda.is_available() else 0.0


def tiny_executor(device: str = "cpu") -> Executor:
    """A tiny random Llama over SmolLM2's vocabulary, with the real tokenizer and NGram drafting."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..executor.model.model_loader import load_model

    tokenizer = load_model(None, progress=False).tokenizer
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    settings = ExecutorConfig(
        device=device,
        num_kv_blocks=256,
        block_size=16,
        max_batch_size=16,
        guided_json_max_whitespace=0,
        speculative_config={"decoding_type": "NGram", "max_draft_len": 3},
    )
    return Executor(model, settings, tokenizer=tokenizer)


def schemas() -> list[dict]:
    with (DATA_DIR / "jsonschemabench" / "Github_trivial.jsonl").open() as f:
        return [json.loads(line)["schema"] for line in f if line.strip()]


@dataclass
class Soak:
    executor: Executor
    num_requests: int
    max_tokens: int
    batch: int
    warmup: int
    schemas: list[dict]
    done: int = 0
    rss_at_warmup: float | None = None
    gpu_at_warmup: float = 0.0
    failures: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def make(self, i: int, rng: random.Random) -> tuple[str, Request]:
        kind = rng.choices(KINDS, WEIGHTS)[0]
        params = SamplingParams(max_tokens=self.max_tokens, seed=i)
        chat = [{"role": "user", "content": f"Request {i}: write something."}]
        if kind == "sampled":
            params.temperature = 0.9
        if kind == "json":
            schema = self.schemas[i % len(self.schemas)]
            return kind, Request(
                chat, params, f"q{i}", {"type": "json_schema", "json_schema": {"schema": schema}}
            )
        if kind == "regex":
            return kind, Request(chat, params, f"q{i}", {"type": "regex", "regex": "(yes|no|[0-9]{1,6})"})
        if kind == "bad":
            _, prompt, fmt, max_tokens = BAD_REQUESTS[i % len(BAD_REQUESTS)]
            return kind, Request(prompt, SamplingParams(max_tokens=max_tokens), f"q{i}", fmt)
        return kind, Request(chat, params, f"q{i}")

    def call(self, thread: int, first: int, other_ids: list[str]) -> None:
        """One call of ``batch`` requests: a stream() that aborts its requests marked aborted, or one
        closed early (what is left is aborted), or a run() (which aborts one of the other thread's)."""
        rng = random.Random(first)
        made = [self.make(i, rng) for i in range(first, min(first + self.batch, self.num_requests))]
        aborted = [r.request_id for kind, r in made if kind == "aborted"]
        mode = rng.random()
        outputs = []
        if aborted and mode < 0.75:
            stream = self.executor.stream([r for _, r in made])
            for n, event in enumerate(stream):
                if event.finished:
                    outputs.append(event.output)
                if n == 3 and mode < 0.5:
                    for request_id in aborted:
                        self.executor.abort_request(request_id)
                elif n == 3:
                    break
            stream.close()
        else:
            for request_id in other_ids[:1]:
                self.executor.abort_request(request_id)
            outputs = self.executor.run([r for _, r in made])
        self.check(made, outputs)
        self.report(thread, len(made))

    def check(self, made, outputs) -> None:
        by_id = {o.request_id: o for o in outputs if o is not None}
        for kind, request in made:
            out = by_id.get(request.request_id)
            with self.lock:
                self.counts[kind] = self.counts.get(kind, 0) + 1
            if out is None:
                continue  # aborted with the closed stream
            if kind == "bad" and out.finish_reason not in (FinishReason.ERROR, FinishReason.ABORT):
                self.failures.append(
                    f"{request.request_id}: a bad request finished {out.finish_reason.value}"
                )
            refused = kind == "json" and "cannot enforce" in (out.error or "")  # guided_unsupported: refuse
            if kind != "bad" and out.finish_reason is FinishReason.ERROR and not refused:
                self.failures.append(f"{request.request_id} ({kind}): {out.error}")
            if (
                out.finish_reason is FinishReason.STOP
                and kind in ("json", "regex")
                and out.guided_valid is not True
            ):
                self.failures.append(
                    f"{request.request_id}: finished guided output not valid: {out.guided_error}"
                )

    def report(self, thread: int, num_done: int) -> None:
        bm = self.executor.block_manager
        with self.lock:
            before = self.done
            self.done += num_done
            if before < self.warmup <= self.done:
                self.rss_at_warmup, self.gpu_at_warmup = rss_mb(), gpu_mb()
            print(
                f"thread {thread}: {self.done:5d}/{self.num_requests} requests  "
                f"pages held {bm.num_blocks - bm.num_free_blocks:3d}/{bm.num_blocks}  rss {rss_mb():7.1f} MB"
                f"  gpu {gpu_mb():7.1f} MB",
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specexec.bench.soak", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=10, help="requests per call")
    parser.add_argument("--warmup", type=int, default=200, help="RSS growth is measured from this request on")
    parser.add_argument("--max-rss-growth-mb", type=float, default=50.0)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    soak = Soak(
        tiny_executor(args.device), args.requests, args.max_tokens, args.batch, args.warmup, schemas()
    )
    firsts = list(range(0, args.requests, args.batch))
    errors: list[BaseException] = []
    in_flight: dict[int, list[str]] = {0: [], 1: []}

    def worker(thread: int) -> None:
        for first in firsts[thread::2]:
            try:
                in_flight[thread] = [f"q{i}" for i in range(first, first + args.batch)]
                soak.call(thread, first, in_flight[1 - thread])
            except BaseException as exc:  # a call must never raise: report it
                errors.append(exc)
                soak.failures.append(f"call at request {first} raised {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    soak.executor.close()
    bm = soak.executor.block_manager
    leaked = bm.num_blocks - bm.num_free_blocks
    rss_end = rss_mb()
    rss_warm = soak.rss_at_warmup or rss_end
    growth = rss_end - rss_warm
    print(f"\nkinds: {soak.counts}")
    print(
        f"pages leaked: {leaked}; RSS {rss_warm:.1f} MB at request {args.warmup}, {rss_end:.1f} MB at "
        f"{args.requests}: growth {growth:.1f} MB (limit {args.max_rss_growth_mb:.0f})"
    )
    gpu_growth = gpu_mb() - soak.gpu_at_warmup
    if args.device != "cpu":
        print(
            f"GPU memory allocated: {soak.gpu_at_warmup:.1f} MB at request {args.warmup}, growth {gpu_growth:.1f} MB"
        )
    print(f"failures: {len(soak.failures)}; wall time {time.perf_counter() - start:.0f} s")
    for failure in soak.failures[:20]:
        print("  " + failure)
    ok = not leaked and not soak.failures and max(growth, gpu_growth) < args.max_rss_growth_mb
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
