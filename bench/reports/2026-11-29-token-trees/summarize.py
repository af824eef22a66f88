"""The report's tables from the bench JSON files: per set and concurrency, each drafter's tok/s over
none's and its acceptance length. Usage: python summarize.py specbench extraction ... (prefix: after-)."""

import json
import sys
from pathlib import Path

here = Path(__file__).parent
for name in sys.argv[1:]:
    results = json.loads((here / f"{name}.json").read_text())["results"]
    none = {r["concurrency"]: r["output_tokens_per_s"] for r in results if r["name"] == "none"}
    rows: dict[str, dict[int, str]] = {}
    for r in results:
        if r["name"] == "none":
            continue
        ratio = r["output_tokens_per_s"] / none[r["concurrency"]]
        rows.setdefault(r["name"], {})[r["concurrency"]] = f"{ratio:.2f}x, {r['mean_acceptance_length']:.2f}"
    print(f"\n{name}: tok/s over none, acceptance length")
    print("| drafter | c=1 | c=8 |\n|---|---|---|")
    for drafter, cells in rows.items():
        print(f"| {drafter} | {cells.get(1, '-')} | {cells.get(8, '-')} |")
