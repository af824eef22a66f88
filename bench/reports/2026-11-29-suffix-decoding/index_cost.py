"""What the suffix index costs: memory and time to index real text, and a lookup's time.

Tokenizes Python's own standard library sources (here for any CPython install) with the embedded
model's tokenizer, indexes growing prefixes of them, and times `speculate` on contexts taken from the
text. Usage: python bench/reports/2026-11-29-suffix-decoding/index_cost.py [--tokens 250000,1000000]
"""

from __future__ import annotations

import argparse
import gc
import random
import sysconfig
import time
import tracemalloc
from pathlib import Path

from specexec.drafters.retrieval.datastore_command import load_tokenizer
from specexec.drafters.retrieval.suffix_index import DEFAULT_LIMITS, SuffixIndex


def stdlib_tokens(tokenizer, limit: int) -> list[list[int]]:
    documents, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        ids = tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False)
        documents.append(ids)
        total += len(ids)
        if total >= limit:
            break
    return documents


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="250000,1000000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.tokens.split(",")]
    tokenizer = load_tokenizer(None)
    corpus = stdlib_tokens(tokenizer, max(sizes))
    rng = random.Random(0)
    for size in sizes:
        documents, total = [], 0
        for d in corpus:
            documents.append(d)
            total += len(d)
            if total >= size:
                break
        gc.collect()
        started = time.perf_counter()  # timed without tracemalloc, which slows every allocation
        index = SuffixIndex()
        for d in documents:
            index.add(d)
        seconds = time.perf_counter() - started
        del index
        gc.collect()
        tracemalloc.start()  # the memory of a second build
        index = SuffixIndex()
        for d in documents:
            index.add(d)
        memory = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        contexts = []
        for _ in range(2000):
            d = rng.choice(documents)
            end = rng.randrange(1, len(d))
            contexts.append(d[max(0, end - 64) : end])
        started = time.perf_counter()
        drafted = sum(len(index.speculate(c, 8, DEFAULT_LIMITS).token_ids) for c in contexts)
        lookup = (time.perf_counter() - started) / len(contexts)
        print(
            f"{total:>9} tokens in {len(documents)} files: indexed in {seconds:.2f} s "
            f"({seconds / total * 1e6:.1f} us/token), {memory / total:.0f} B/token beside the token lists; "
            f"speculate {lookup * 1e6:.0f} us per call ({drafted / len(contexts):.2f} drafts per call)"
        )
        del index


if __name__ == "__main__":
    main()
