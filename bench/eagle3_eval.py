"""Is a newly trained EAGLE-3 head better than the shipped one? Measured side by side in one process, on
work the corpus never saw.

    python -m specexec.bench.eagle3_eval --head runs/eagle3 [--against drafters/eagle3/heads/...] \\
        [--num-requests 16] [--max-tokens 128] [--max-draft-len 3] [--with-confidence] [--with-lookup]
        [--output DIR]

For each evaluation set (Spec-Bench and the extraction set, the benchmark's own draws), at batch 1 and
greedy: no drafts, the current head, the new head (and with ``--with-confidence`` both heads under
draft_len_policy "confidence", and with ``--with-lookup`` both heads with ``prompt_lookup``); per head
the acceptance length, the acceptance rate
at each draft position, and tokens/s over no drafts. The engines take turns prompt by prompt, so drift
of a shared machine falls on all of them alike. Before anything runs, every evaluation prompt is
checked against the new head's corpus and the bundled token archive by the hash of its rendered token
ids (and its text against the self-instruct pools): an overlap stops the evaluation. The head's own
forward (the drafting step, one token) is timed against one target decode forward. The new head is
"better" only when its acceptance length and its speed-up are both higher than the current head's on
every set.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from ..drafters.eagle3.head import SHIPPED_HEAD
from ..drafters.eagle3.training.prompts import normalized_hash, read_pool
from ..drafters.training.archive import BUNDLED_ARCHIVE, CorpusArchive
from ..drafters.training.corpus import read_corpus
from ..prompt_sets.datasets import load_dataset
from .engines.specexec_hf import Workload, chat_token_ids, run_specexec
from .records import summarize

EVAL_SETS = ("specbench", "extraction")


def ids_hash(token_ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(list(token_ids)).encode()).hexdigest()[:20]


def check_held_out(head_dir: Path, workloads: dict[str, Workload], archive_dir: Path | None = None) -> dict:
    """Raise ValueError when an evaluation prompt is in the head's corpus (by token ids) or pool (by
    text), or in the token archive's answers or instructions (``archive_dir``, `eagle3_archive`: a
    head trained on another machine comes without its corpus, and the archive holds what it was
    trained on); returns how many prompts were checked against how many sequences and instructions."""
    corpus = read_corpus(head_dir / "corpus" / "corpus.jsonl")
    instructions = read_pool(head_dir / "corpus" / "prompt_pool.jsonl")
    archive = CorpusArchive(archive_dir) if archive_dir is not None else None
    answers = archive.answers() if archive is not None else []
    instructions += archive.instructions() if archive is not None else []
    seen = {ids_hash(r["prompt_token_ids"]) for r in corpus + answers}
    pool = {r["hash"] for r in instructions}
    checked = 0
    for name, work in workloads.items():
        for prompt, ids in zip(work.prompts, work.token_ids):
            texts = {normalized_hash(m["content"]) for m in prompt.messages}
            if ids_hash(ids) in seen or texts & pool:
                raise ValueError(
                    f"{name} prompt {prompt.id} is in the corpus of {head_dir} or the token archive: "
                    "not held out"
                )
            checked += 1
    return {
        "prompts": checked,
        "corpus_sequences": len(corpus),
        "archive_answers": len(answers),
        "pool_instructions": len(pool),
    }


def head_forward_cost(executor, repeats: int = 20) -> float:
    """The drafter's one-token forward over the target's one-token decode forward (median times)."""
    import statistics

    drafter = executor.speculation.drafter

    def median(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    return median(drafter.warm_up) / median(lambda: executor.time_forward(1, 128))


def evaluate_heads(
    new_head: Path | None,
    current_head: Path,
    num_requests: int,
    max_tokens: int,
    k: int,
    with_confidence: bool = False,
    with_lookup: bool = False,
) -> dict:
    from ..executor.config import ExecutorConfig
    from ..executor.executor import Executor

    def executor_for(head: Path | None, policy: str = "fixed", lookup: bool = False) -> Executor:
        spec = (
            None
            if head is None
            else {
                "decoding_type": "Eagle",
                "max_draft_len": k,
                "speculative_model": str(head),
                "draft_len_policy": policy,
                "prompt_lookup": lookup,
            }
        )
        return Executor(config=ExecutorConfig(speculative_config=spec, progress=False, warmup=True))

    heads = {"current": (current_head, "cur"), "new": (new_head, "new")}
    heads = {label: named for label, named in heads.items() if named[0] is not None}
    engines = {"none": executor_for(None)}
    engines.update({label: executor_for(head) for label, (head, _) in heads.items()})
    for head, short in heads.values():  # the variants are not part of the shipping rule
        if with_confidence:  # each chain ended by the head's confidence
            engines[f"{short}+conf"] = executor_for(head, "confidence")
        if with_lookup:  # drafts from the request's own text where the head is unsure
            engines[f"{short}+look"] = executor_for(head, lookup=True)
    tok = engines["none"].tokenizer
    workloads = {}
    for name in EVAL_SETS:
        prompts = load_dataset(name, num_requests)
        ids = chat_token_ids(tok, prompts)
        workloads[name] = Workload(prompts, ids, max_tokens, 0.0)
    checked_head = new_head if new_head is not None else current_head
    report: dict = {"held_out": check_held_out(checked_head, workloads, BUNDLED_ARCHIVE), "sets": {}}
    report["machine"] = machine_line(engines["none"])
    for name, work in workloads.items():
        rows = run_interleaved(engines, work)
        base = rows["none"]["output_tokens_per_s"]
        report["sets"][name] = {
            label: {
                "acceptance_length": row["mean_acceptance_length"],
                "acceptance_per_position": row["acceptance_per_position"],
                "tokens_per_s": row["output_tokens_per_s"],
                "speedup": row["output_tokens_per_s"] / base if base else None,
            }
            for label, row in rows.items()
        }
    report["head_forward_cost"] = {label: head_forward_cost(engines[label]) for label in heads}
    report["new_is_better"] = is_better(report["sets"]) if "new" in heads else None
    for executor in engines.values():
        executor.close()
    return report


def run_interleaved(engines: dict, work: Workload) -> dict[str, dict]:
    """Each engine's summary row over ``work`` at batch 1, the engines taking turns prompt by prompt
    (see `run_interleaved_records`)."""
    records, wall = run_interleaved_records(engines, work)
    return {label: summarize(label, 1, records[label], wall[label]) for label in engines}


def run_interleaved_records(engines: dict, work: Workload) -> tuple[dict[str, list], dict[str, float]]:
    """Each engine's records and wall seconds over ``work`` at batch 1, the engines taking turns prompt
    by prompt (the order rotating each prompt), so a slow spell of a shared machine falls on every engine
    alike instead of on whichever ran through the set at that time."""
    labels = list(engines)
    records: dict[str, list] = {label: [] for label in labels}
    wall = dict.fromkeys(labels, 0.0)
    for i in range(len(work.prompts)):
        one = replace(work, prompts=[work.prompts[i]], token_ids=[work.token_ids[i]])
        for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
            done, seconds = run_specexec(engines[label], one, 1)
            records[label] += done
            wall[label] += seconds
    return records, wall


def is_better(sets: dict) -> bool:
    """The rule for shipping: a higher acceptance length and a higher speed-up on every set."""
    return all(
        (s["new"]["acceptance_length"] or 0) > (s["current"]["acceptance_length"] or 0)
        and (s["new"]["speedup"] or 0) > (s["current"]["speedup"] or 0)
        for s in sets.values()
    )


def machine_line(executor) -> str:
    """Where the figures come from: the CPU (or device), torch, threads, dtype, linear kernels."""
    import torch

    from ..executor.layers.cpu_info import describe_cpu

    device = executor.model.device
    where = describe_cpu() if device.type == "cpu" else torch.cuda.get_device_name(device)
    linear = executor.setup.linear_backend
    return (
        f"{where}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{executor.setup.dtype_choice.dtype}, cpu_linear {linear.backend} ({linear.reason})"
    )


def format_report(report: dict) -> str:
    held = report["held_out"]
    lines = [f"machine: {report['machine']}"] if "machine" in report else []
    lines += [
        f"held-out check: {held['prompts']} evaluation prompts, none among the corpus's "
        f"{held['corpus_sequences']} sequences, the archive's {held.get('archive_answers', 0)} answers "
        f"or the pool's {held['pool_instructions']} instructions"
    ]
    for name, rows in report["sets"].items():
        for label, r in rows.items():
            acc = "-" if r["acceptance_length"] is None else f"{r['acceptance_length']:.2f}"
            per_pos = " ".join(f"{a:.2f}" for a in r["acceptance_per_position"]) or "-"
            lines.append(
                f"{name:10} {label:8} acc.len {acc:>5}  per position {per_pos:16}  "
                f"{r['tokens_per_s']:.1f} tok/s  {r['speedup']:.2f}x no drafts"
            )
    costs = ", ".join(f"{label} {cost:.2f}" for label, cost in report["head_forward_cost"].items())
    lines.append(f"head forward over 1 + k positions / target decode forward: {costs}")
    if report["new_is_better"] is not None:
        lines.append("new head is better on every set: " + ("yes" if report["new_is_better"] else "no"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--head",
        type=Path,
        help="the new head's train-eagle3 --output (none: the current head's rows only, for its variants)",
    )
    parser.add_argument(
        "--against", type=Path, default=SHIPPED_HEAD, help="the current head (default: shipped)"
    )
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-draft-len", type=int, default=3)
    parser.add_argument(
        "--with-confidence",
        action="store_true",
        help="also both heads under draft_len_policy 'confidence' (rows cur+conf, new+conf; the shipping "
        "rule compares the fixed-length rows)",
    )
    parser.add_argument(
        "--with-lookup",
        action="store_true",
        help="also both heads with prompt_lookup (rows cur+look, new+look; not part of the shipping rule)",
    )
    parser.add_argument("--output", type=Path, help="write eval.json and eval.txt here")
    args = parser.parse_args(argv)
    report = evaluate_heads(
        args.head,
        args.against,
        args.num_requests,
        args.max_tokens,
        args.max_draft_len,
        args.with_confidence,
        args.with_lookup,
    )
    text = format_report(report)
    print(text)
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "eval.json").write_text(json.dumps(report, indent=1) + "\n")
        (args.output / "eval.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
