"""A training corpus of the answers a head has not seen, plus as many older answers drawn at random
(replay), so that a CPU epoch spends half its steps on new answers instead of a fifth.

    python bench/reports/2026-11-26-eagle3-new-answers/make_replay_corpus.py \\
        --corpus .train/smollm2-eagle3/corpus --seen 8198 --output .train/mix/corpus

``--seen``: how many of the corpus's first records the start head was trained on (its
``training_log.json`` says ``corpus_records``); the corpus only ever appends, so those are the first
ones. The new corpus lists the drawn older records, then every new one, and links the features
directory instead of copying it; `specexec train-eagle3 --output <parent of --output>` then trains on
it (the validation split is the same one-in-25 hash split, over the records listed).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="the whole corpus directory")
    parser.add_argument("--seen", type=int, required=True, help="records the start head was trained on")
    parser.add_argument("--output", type=Path, required=True, help="the new corpus directory")
    parser.add_argument("--replay", type=float, default=1.0, help="older records per new one")
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args()
    lines = (args.corpus / "corpus.jsonl").read_text().splitlines()
    seen, new = lines[: args.seen], lines[args.seen :]
    if not new:
        raise SystemExit(f"{args.corpus} holds no record after the first {args.seen}")
    count = min(len(seen), round(args.replay * len(new)))
    drawn = sorted(random.Random(args.seed).sample(range(len(seen)), count))
    chosen = [seen[i] for i in drawn] + new
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "corpus.jsonl").write_text("\n".join(chosen) + "\n")
    shutil.copy(args.corpus / "prompt_pool.jsonl", args.output / "prompt_pool.jsonl")
    link = args.output / "features"
    if not link.exists():
        link.symlink_to((args.corpus / "features").resolve())

    def positions(group: list[str]) -> int:
        return sum(json.loads(line)["positions"] for line in group)

    print(
        f"{args.output}: {len(new)} new records ({positions(new)} positions) and {count} older ones "
        f"({positions(chosen[:count])} positions)"
    )


if __name__ == "__main__":
    main()
