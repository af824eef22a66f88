"""How many held-out answer tokens an EAGLE-3 head's draft vocabulary holds, against vocabularies chosen
afresh from the corpus (`choose_draft_vocab`, as ``train-eagle3 --fresh-vocab`` chooses them).

    python bench/reports/2026-11-26-eagle3-vocab/vocab_coverage.py --corpus .train/smollm2-eagle3/corpus \\
        --features /tmp/heldout [--head drafters/eagle3/heads/smollm2-135m-instruct-eagle3] [--sizes 8192 10240]

``--features`` is the held-out cache `../2026-11-26-eagle3-window/window_sweep.py` writes (the target's
greedy answers to the evaluation prompts); only their token ids are read. A draft token outside the
vocabulary can never be proposed, so the share held is a ceiling on agreement at every draft step.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from safetensors.torch import load_file
from specexec.bench.eagle3_eval import EVAL_SETS
from specexec.drafters.eagle3.head import SHIPPED_HEAD
from specexec.drafters.eagle3.training.corpus import read_corpus
from specexec.drafters.eagle3.training.features import choose_draft_vocab


def held_share(answers: torch.Tensor, in_vocab: torch.Tensor) -> float:
    return float(in_vocab[answers].float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="a train-eagle3 corpus directory")
    parser.add_argument("--features", type=Path, required=True, help="the held-out cache of window_sweep.py")
    parser.add_argument("--head", type=Path, default=SHIPPED_HEAD)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8192, 10240, 12288, 16384])
    args = parser.parse_args()
    t2d = load_file(args.head / "model.safetensors")["t2d"].bool()  # [vocab] in the head's draft vocabulary
    records = read_corpus(args.corpus / "corpus.jsonl")
    fresh = {}
    for size in args.sizes:
        in_vocab = torch.zeros_like(t2d)
        in_vocab[choose_draft_vocab(records, size, len(t2d))] = True
        fresh[size] = in_vocab
    print(f"corpus: {len(records)} sequences; head: {args.head} ({int(t2d.sum())} draft tokens)")
    for name in EVAL_SETS:
        held_out = read_corpus(args.features / name / "corpus.jsonl")
        answers = torch.tensor([t for r in held_out for t in r["output_token_ids"]])  # [answer tokens]
        shares = "  ".join(f"fresh {size}: {held_share(answers, v):.3f}" for size, v in fresh.items())
        print(f"{name:10s} {len(answers)} answer tokens  head: {held_share(answers, t2d):.3f}  {shares}")


if __name__ == "__main__":
    main()
