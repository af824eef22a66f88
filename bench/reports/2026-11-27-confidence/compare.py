"""EAGLE-3's draft length chosen per token by the head's confidence (``draft_len_policy: confidence``)
against the default per-request policy, side by side: batch 1, greedy, 128 tokens, engines taking turns
prompt by prompt, on held-out Spec-Bench and extraction prompts (`eagle3_eval.side_by_side`). Every
engine on the executor's defaults (``cpu_linear: auto``, ``head_quantization: auto``, prompt lookup on)
but for the settings its label names.

    python bench/reports/2026-11-27-confidence/compare.py --num-requests 24 --output DIR
"""

import argparse
from pathlib import Path

from specexec.bench.eagle3_eval import machine_line, save_side_by_side, side_by_side
from specexec.executor.config import ExecutorConfig
from specexec.executor.executor import Executor

EAGLE3 = {"decoding_type": "Eagle", "max_draft_len": 3}
ENGINES = {  # label: speculative_config
    "none": None,
    "eagle3 k=3": EAGLE3,
    "eagle3 k=3 confidence": {**EAGLE3, "draft_len_policy": "confidence"},
    "eagle3 k=5 confidence": {**EAGLE3, "max_draft_len": 5, "draft_len_policy": "confidence"},
    "eagle3 k=2": {**EAGLE3, "max_draft_len": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-requests", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    engines = {
        label: Executor(config=ExecutorConfig(speculative_config=spec, progress=False, warmup=True))
        for label, spec in ENGINES.items()
    }
    drafter = engines["eagle3 k=3"].speculation.drafter
    report = {"machine": machine_line(engines["eagle3 k=3"]), "head": drafter.head_quantization.reason}
    lines = [f"machine: {report['machine']}", f"EAGLE-3 head: {report['head']}", ""]
    report["sets"], tables = side_by_side(engines, args.num_requests, args.max_tokens)
    lines += tables
    save_side_by_side(report, lines, args.output)
    for e in engines.values():
        e.close()


if __name__ == "__main__":
    main()
