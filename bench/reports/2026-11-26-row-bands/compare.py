"""`cpu_linear: auto`'s kernels by rows (the BLAS for decode, MKL's packed GEMM or oneDNN for verify)
against everything on the BLAS, side by side: batch 1, greedy, 128 tokens, engines taking turns prompt
by prompt (`eagle3_eval.run_interleaved_records`), on held-out Spec-Bench and extraction prompts.

    python bench/reports/2026-11-26-row-bands/compare.py --num-requests 24 --output DIR
    python bench/reports/2026-11-26-row-bands/compare.py --num-requests 24 --output DIR \
        --engines 'none,eagle3 auto,eagle3 policy auto,eagle3 k=2 auto' --name policy

Engines: no drafts; EAGLE-3 (the shipped head with prompt lookup, the default Eagle settings) and
NGram at k=3, each on ``cpu_linear: blas`` and ``auto``; EAGLE-3 at k=2 on auto. Where auto keeps the
BLAS for one row, the no-drafts engine runs the same kernels under both, so it runs once (on blas).
Speed-ups are over it; "same text" counts outputs equal to its greedy text. "eagle3 policy auto" is
EAGLE-3 with ``max_draft_len: 3`` and ``draft_len_policy: auto`` (k per request and step from the
measured forward-cost curve). ``--engines`` runs a subset; ``--name`` names the output files.
"""

import argparse
from pathlib import Path

from specexec.bench.eagle3_eval import machine_line, save_side_by_side, side_by_side
from specexec.executor.config import ExecutorConfig
from specexec.executor.executor import Executor

EAGLE3, NGRAM = {"decoding_type": "Eagle", "max_draft_len": 3}, {"decoding_type": "NGram", "max_draft_len": 3}
ENGINES = {  # label: (speculative_config, cpu_linear)
    "none": (None, "blas"),
    "eagle3 blas": (EAGLE3, "blas"),
    "eagle3 auto": (EAGLE3, "auto"),
    "ngram blas": (NGRAM, "blas"),
    "ngram auto": (NGRAM, "auto"),
    "eagle3 k=2 auto": ({**EAGLE3, "max_draft_len": 2}, "auto"),
    "eagle3 policy auto": ({**EAGLE3, "draft_len_policy": "auto"}, "auto"),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-requests", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--engines", default=",".join(label for label in ENGINES if "policy" not in label))
    parser.add_argument("--name", default="compare")
    args = parser.parse_args()
    chosen = args.engines.split(",")
    if chosen[0] != "none" or not set(chosen) <= set(ENGINES):
        parser.error(f"--engines: 'none' first, then any of {', '.join(ENGINES)}")

    def executor(spec, cpu_linear):
        config = ExecutorConfig(speculative_config=spec, cpu_linear=cpu_linear, progress=False, warmup=True)
        return Executor(config=config)

    engines = {label: executor(*ENGINES[label]) for label in chosen}
    auto = engines.get("eagle3 auto", engines[chosen[-1]])
    report = {"machine": machine_line(auto)}
    report["kernels"] = {label: e.linear_backend.backend for label, e in engines.items()}
    lines = [f"machine: {report['machine']}", f"kernels: {report['kernels']}", ""]
    report["sets"], tables = side_by_side(engines, args.num_requests, args.max_tokens)
    lines += tables
    save_side_by_side(report, lines, args.output, args.name)
    for e in engines.values():
        e.close()


if __name__ == "__main__":
    main()
