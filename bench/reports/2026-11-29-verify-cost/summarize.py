"""The table of README.md from verify_cost.jsonl: per file and engine, a forward over 4 and 8 tokens
against one (the range over rounds), at each context, and specexec's one-token time over llama.cpp's."""

import collections
import json
import sys
from pathlib import Path

with Path(sys.argv[1] if len(sys.argv) > 1 else "verify_cost.jsonl").open() as lines:
    rows = [json.loads(line) for line in lines]
ratios = collections.defaultdict(list)
for row in rows:
    name, ms = Path(row["file"]).stem, row["ms"]
    for depth in (0, 1024):
        for n in (4, 8):
            ratios[(name, depth, row["engine"], n)].append(ms[f"pp{n}@d{depth}"] / ms[f"pp1@d{depth}"])
        ratios[(name, depth, row["engine"], 1)].append(ms[f"pp1@d{depth}"])
print("| file | context | engine | 1 token (ms) | 4 tokens / 1 | 8 tokens / 1 |")
print("|---|---|---|---|---|---|")
for name, depth, engine in sorted({key[:3] for key in ratios}):
    cells = []
    for n in (1, 4, 8):
        values = ratios[(name, depth, engine, n)]
        fmt = "{:.1f}" if n == 1 else "{:.2f}x"
        cells.append(f"{fmt.format(min(values))}-{fmt.format(max(values))}")
    print(f"| {name} | {depth} | {engine} | " + " | ".join(cells) + " |")
