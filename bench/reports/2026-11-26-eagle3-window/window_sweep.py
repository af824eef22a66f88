"""Acceptance length of an EAGLE-3 head at several sliding windows, simulated on teacher-forced features.

    python bench/reports/2026-11-26-eagle3-window/window_sweep.py --head drafters/eagle3/heads/smollm2-135m-instruct-eagle3 \\
        --features /tmp/heldout [--num-requests 24] [--windows 64 128 256 512 1024 0]

The target answers the evaluation prompts (the benchmark's own draws, as `eagle3_eval` takes them; greedy,
128 tokens) with its hidden states captured over the whole context (cached under ``--features``). The
head is then run as the training-time test runs it (each unrolled step k at every position, fed the
true tokens) with its attention cut to each window (0: none), and the verify chain is walked as greedy
decoding walks it: from the first answer position, a step accepts drafts while they equal the answer's
tokens and moves on by the accepted count + 1. Run over whole contexts this matched the executor's own
acceptance (Spec-Bench 1.497 against 1.51 measured, extraction 2.59 against 2.53).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from specexec.bench.eagle3_eval import EVAL_SETS
from specexec.drafters.eagle3.training.corpus import read_corpus
from specexec.drafters.eagle3.training.features import load_features
from specexec.drafters.eagle3.training.scoring import MAX_CONTEXT, held_out_features, scoring_head
from specexec.drafters.eagle3.training.train_loop import make_batch
from specexec.drafters.eagle3.training.ttt import ChainAttention, _shift


@torch.no_grad()
def simulate(head, feats, lm_rows, in_draft, window: int | None, k: int = 3) -> tuple[float, list[float]]:
    lengths, accepted_at = [], [0] * k
    for f in feats:
        b = make_batch([f], lm_rows, in_draft, MAX_CONTEXT)
        t = b.next_ids.shape[1]
        attend = ChainAttention(1, t, b.real, window)
        hidden = head.fuse(b.aux.reshape(t, -1))
        drafts = []
        for step in range(k):  # step k at index i drafts token i + 2 + k of the sequence
            ids, pos = _shift(b.next_ids, step, 0).reshape(-1), (b.positions + step).reshape(-1)
            hidden = head.step(ids, hidden, pos, attend)
            drafts.append(head.to_target_ids(head.logits(hidden).argmax(-1)))
        drafts = torch.stack(drafts)  # [k, T] target ids
        i = max(f.answer_start - f.start_pos - 1, 0)  # the first draft follows the prefill's token
        while i < t - k:
            n = 0
            while n < k and int(drafts[n, i]) == int(f.token_ids[i + 2 + n]):
                n += 1
            for j in range(n):
                accepted_at[j] += 1
            lengths.append(n + 1)
            i += n + 1
    return sum(lengths) / len(lengths), [a / len(lengths) for a in accepted_at]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", type=Path, required=True)
    parser.add_argument("--features", type=Path, required=True, help="where the held-out features are cached")
    parser.add_argument("--num-requests", type=int, default=24)
    parser.add_argument("--windows", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 0])
    args = parser.parse_args()
    head, lm_rows, in_draft, num_layers = scoring_head(args.head)
    for name in EVAL_SETS:
        where = held_out_features(name, args.num_requests, args.features, num_layers)
        feats = load_features(read_corpus(where / "corpus.jsonl"), where, head.config.target_hidden_size)
        for window in args.windows:
            length, per_position = simulate(head, feats, lm_rows, in_draft, window or None)
            shown = " ".join(f"{a:.2f}" for a in per_position)
            print(
                f"{name:10s} window {window or 'none':>5}  acc. len {length:.3f}  per position {shown}",
                flush=True,
            )


if __name__ == "__main__":
    main()
