"""Would a draft tree make the shipped EAGLE-3 head pay on Spec-Bench on this CPU? An upper bound, offline.

    python bench/reports/2026-11-27-trees/tree_ceiling.py --features /tmp/heldout \\
        [--head drafters/eagle3/heads/smollm2-135m-instruct-eagle3] [--output DIR]

1. Acceptance. The head is unrolled teacher-forced over the target's greedy answers to the held-out
   evaluation draws (`scoring.held_out_features`, 24 prompts per set), as training validates it:
   unrolled step k at answer position t is fed the target's own token and the head's step k-1 output,
   and attends the real context and its own chain. That is exactly the accepted path of any draft tree,
   so the rank of the target's token in each step's draft logits (out-of-vocabulary: never drafted)
   says how far every tree would have been accepted at t. A static tree is a prefix-closed set of rank
   paths (``(0,)`` the head's top draft, ``(1, 0)`` its second draft then the top draft after it); the
   best tree of N nodes holds the N most frequent rank prefixes. Trees are chosen on the first half of
   a set's positions and scored on the second, beside the chain scored there.
2. Cost. For a verify of n rows the executor is started with a drafter of n - 1 drafts, so that
   ``cpu_linear: auto`` picks the kernels it would for that verify (MKL's packed GEMM for exactly those
   rows where that measures faster), and a target forward over n new tokens after ``--context`` cached
   ones is timed against a one-token forward, taking turns.
3. Bound. The measured chain (k=3, acceptance length ``--chain-acceptance`` at ``--chain-speedup`` no
   drafts, from ../2026-11-27-int8-head/) fixes what drafting and the step's other work cost in decode
   steps: ``acceptance / speedup - verify(4)``. A tree is given the same drafting cost (a tree drafts
   more rows per head forward, so that is optimistic) and the chain's acceptance plus what the tree adds
   over the chain offline (prompt lookup's gain is counted again on top: optimistic too).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import torch
from specexec.bench.eagle3_eval import machine_line
from specexec.drafters.eagle3.head import SHIPPED_HEAD
from specexec.drafters.eagle3.training.corpus import read_corpus
from specexec.drafters.eagle3.training.features import load_features
from specexec.drafters.eagle3.training.scoring import MAX_CONTEXT, held_out_features, scoring_head
from specexec.drafters.eagle3.training.train_loop import make_batch
from specexec.drafters.eagle3.training.ttt import ChainAttention, _shift
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.scratch_forward import scratch_forward
from specexec.executor.executor import Executor
from specexec.executor.layers.measurement_cache import interleaved_medians

DEPTH = 5  #: unrolled steps scored (trees deeper than this are not considered)
NEVER = 10**6  #: the rank of a token the head cannot draft (outside its vocabulary, or not an answer)
NODE_COUNTS = (3, 5, 7, 9, 11, 15)  #: tree sizes; a verify holds 1 + nodes rows
CHAIN = ((0,), (0, 0), (0, 0, 0))


@torch.no_grad()
def rank_paths(head, lm_rows, in_draft, where: Path) -> torch.Tensor:
    """[positions, DEPTH]: per answer position, the rank of the target's greedy token at each step."""
    records = list(read_corpus(where / "corpus.jsonl"))
    out = []
    for j in range(0, len(records), 4):
        feats = load_features(records[j : j + 4], where, head.config.target_hidden_size)
        batch = make_batch(feats, lm_rows, in_draft, MAX_CONTEXT)
        b, t = batch.next_ids.shape
        attend = ChainAttention(b, t, batch.real, head.config.sliding_window)
        hidden = head.fuse(batch.aux.reshape(b * t, -1))  # [B*T, hidden]
        ranks = torch.full((b, t, DEPTH), NEVER, dtype=torch.long)
        for k in range(DEPTH):
            ids = _shift(batch.next_ids, k, 0)
            hidden = head.step(ids.reshape(-1), hidden, (batch.positions + k).reshape(-1), attend)
            logits = head.logits(hidden).float().view(b, t, -1)[:, : t - k]  # [B, T - k, draft_vocab]
            target = logits.gather(-1, batch.target_ids[:, k:, None])  # [B, T - k, 1]
            rank = (logits > target).sum(-1)  # [B, T - k]
            scored = batch.valid[:, k:] & batch.real[:, : t - k]
            ranks[:, : t - k, k] = torch.where(scored, rank, NEVER)
        out.append(ranks[batch.answer & batch.real])
    return torch.cat(out)


def acceptance_length(ranks: torch.Tensor, tree) -> float:
    """Mean tokens per verify (accepted drafts + 1) of a static tree of rank paths."""
    tree, total = set(tree), 0
    for row in ranks.tolist():
        depth = 0
        while depth < len(row) and tuple(row[: depth + 1]) in tree:
            depth += 1
        total += 1 + depth
    return total / len(ranks)


def best_tree(ranks: torch.Tensor, num_nodes: int) -> set[tuple[int, ...]]:
    """The ``num_nodes`` most frequent rank prefixes (prefix-closed: a prefix is at least as frequent)."""
    counts: Counter = Counter()
    for row in ranks.tolist():
        for depth in range(DEPTH):
            if row[depth] >= NEVER:
                break
            counts[tuple(row[: depth + 1])] += 1
    return {path for path, _ in counts.most_common(num_nodes)}


def verify_cost(rows: int, context: int, repeats: int = 11) -> float:
    """A target forward over ``rows`` new tokens in one-token forwards, on the kernels picked for it."""
    spec = {"decoding_type": "NGram", "max_draft_len": rows - 1}
    with Executor(config=ExecutorConfig(progress=False, speculative_config=spec)) as executor:
        runner, pages = executor.core.runner, executor.block_manager
        works = {n: (lambda n=n: scratch_forward(runner, pages, n, context)) for n in (1, rows)}
        with torch.inference_mode():
            for work in works.values():
                work()  # warm-up
            seconds = interleaved_medians(works, repeats)
        print(f"  verify {rows:2d} rows: {executor.linear_backend.backend}", flush=True)
        return seconds[rows] / seconds[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--features", type=Path, required=True, help="held-out features cache")
    parser.add_argument("--head", type=Path, default=SHIPPED_HEAD)
    parser.add_argument("--context", type=int, default=300, help="cached tokens before a timed verify")
    parser.add_argument("--chain-acceptance", type=float, default=1.92)
    parser.add_argument("--chain-speedup", type=float, default=1.33)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    lines: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    head, lm_rows, in_draft, num_layers = scoring_head(args.head)
    gains: dict[str, dict[int, float]] = {}
    for name in ("specbench", "extraction"):
        ranks = rank_paths(head, lm_rows, in_draft, held_out_features(name, 24, args.features, num_layers))
        fit, test = ranks[: len(ranks) // 2], ranks[len(ranks) // 2 :]
        top = " ".join(f"{float((ranks[:, 0] == r).float().mean()):.3f}" for r in range(4))
        outside = float((ranks[:, 0] >= NEVER).float().mean())
        say(
            f"{name}: {len(ranks)} answer positions; step-0 rank 0/1/2/3 shares {top}; never drafted {outside:.3f}"
        )
        chain = acceptance_length(test, CHAIN)
        say(f"  chain k=3 (3 nodes): acceptance length {chain:.3f} on the second half")
        gains[name] = {}
        for n in NODE_COUNTS:
            tree = best_tree(fit, n)
            length = acceptance_length(test, tree)
            gains[name][n] = length - chain
            shape = ", ".join("".join(map(str, p)) for p in sorted(tree, key=lambda p: (len(p), p)))
            say(
                f"  best tree of {n:2d} nodes: {length:.3f} ({length - chain:+.3f} over the chain)  [{shape}]"
            )

    say()
    cost = {n: verify_cost(n + 1, args.context) for n in (3, *NODE_COUNTS)}
    overhead = args.chain_acceptance / args.chain_speedup - cost[3]
    say(f"verify cost (x one-token forward, {args.context} cached tokens): "
        + "  ".join(f"{n + 1} rows {c:.2f}x" for n, c in cost.items()))  # fmt: skip
    say(f"drafting and other step work of the measured chain: {overhead:.3f} decode steps")
    say()
    say("| drafts | verify rows | verify cost | Spec-Bench acceptance (bound) | speed-up (bound) |")
    say("|---|---|---|---|---|")
    say(
        f"| chain k=3 (measured) | 4 | {cost[3]:.2f}x | {args.chain_acceptance:.2f} | {args.chain_speedup:.2f}x |"
    )
    for n in NODE_COUNTS:
        length = args.chain_acceptance + gains["specbench"][n]
        speedup = length / (cost[n] + overhead)
        say(f"| best tree of {n} nodes | {n + 1} | {cost[n]:.2f}x | {length:.2f} | {speedup:.2f}x |")
    say()
    with Executor(config=ExecutorConfig(progress=False)) as executor:
        say(f"machine: {machine_line(executor)}")
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "tree_ceiling.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
