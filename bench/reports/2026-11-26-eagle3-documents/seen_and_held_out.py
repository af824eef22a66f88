"""Teacher-forced agreement of an EAGLE-3 head per Spec-Bench category, on answers it was trained on and on
held-out ones: how much of the gap on open chat is the head's capacity and how much its data.

    python bench/reports/2026-11-26-eagle3-documents/seen_and_held_out.py \\
        --head drafters/eagle3/heads/smollm2-135m-instruct-eagle3 --corpus .train/smollm2-eagle3/corpus \\
        --features /tmp/heldout [--per-category 12]

Seen: the corpus's greedy answers to Spec-Bench's non-benchmark prompts outside the validation split, up to
``--per-category`` per category. Held out: the evaluation draw `eagle3_eval` takes (24 prompts, greedy,
128 tokens, its features cached under ``--features``). Agreement at draft steps 0/1/2 is the training
validation's (each unrolled step fed the head's own output; a token outside the draft vocabulary counts
as a miss), and the estimated acceptance length is 1 + a0 + a0 a1 + a0 a1 a2.
"""

from __future__ import annotations

import argparse
import types
from collections import defaultdict
from pathlib import Path

import torch
from specexec.drafters.eagle3.training.checkpoint import is_validation
from specexec.drafters.eagle3.training.corpus import SPECBENCH_CATEGORIES, read_corpus
from specexec.drafters.eagle3.training.features import load_features
from specexec.drafters.eagle3.training.scoring import MAX_CONTEXT, held_out_features, scoring_head
from specexec.drafters.eagle3.training.train_loop import evaluate
from specexec.prompt_sets.datasets import load_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, required=True, help="the head's corpus directory")
    parser.add_argument("--features", type=Path, required=True, help="where the held-out features are cached")
    parser.add_argument("--per-category", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(2)
    head, lm_rows, in_draft, num_layers = scoring_head(args.head)
    category = {p.id: c for c in SPECBENCH_CATEGORIES for p in load_dataset(f"specbench:{c}")}
    held_dir = held_out_features("specbench", 24, args.features, num_layers)
    sets = {"seen": (args.corpus, defaultdict(list)), "held out": (held_dir, defaultdict(list))}
    for r in read_corpus(args.corpus / "corpus.jsonl"):
        if r["id"] in category and not is_validation(r["id"]):
            sets["seen"][1][category[r["id"]]].append(r)
    for r in read_corpus(held_dir / "corpus.jsonl"):
        sets["held out"][1][category[r["id"]]].append(r)
    settings = types.SimpleNamespace(max_len=MAX_CONTEXT, ttt_steps=3)
    print(f"head {args.head}")
    for c in SPECBENCH_CATEGORIES:
        for name, (where, groups) in sets.items():
            records = groups[c][: args.per_category]
            if not records:
                continue
            feats = load_features(records, where, head.config.target_hidden_size)
            result = evaluate(head, feats, lm_rows, in_draft, settings)
            shown = " ".join(f"{a:.2f}" for a in result["agree"])
            print(
                f"{c:15s} {name:8s} {len(records):3d} answers  agreement {shown}  "
                f"est. acc. len {result['est_acceptance_length']:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
