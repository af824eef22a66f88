"""The benchmark's outputs: a terminal table, a JSON file, and plots."""

from __future__ import annotations

import json
from pathlib import Path


def _fmt(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


COLUMNS = (
    ("name", "{}"),
    ("c", "{}"),
    ("n", "{}"),
    ("tok/s", ".1f"),
    ("tok/s/user", ".1f"),
    ("ttft p50 ms", ".0f"),
    ("tpot p50 ms", ".1f"),
    ("acc.len", ".2f"),
    ("draft%", ".0%"),
    ("valid", ".0%"),
    ("vs none", ".2f"),
    ("vs hf", ".2f"),
)


def format_table(rows: list[dict], guided: bool = False) -> str:
    """One line per row; ``valid`` (the schema-valid share) only for a ``--guided`` run, where it means
    something (unguided outputs are not asked to follow the prompts' schemas)."""
    cells = [
        [
            row["name"],
            str(row["concurrency"]),
            str(row["num_requests"]),
            _fmt(row["output_tokens_per_s"]),
            _fmt(row["per_user_tokens_per_s"]),
            _fmt(row["ttft_ms_p50"], ".0f"),
            _fmt(row["tpot_ms_p50"]),
            _fmt(row["mean_acceptance_length"], ".2f"),
            _fmt(row.get("drafting_share") if row.get("mean_acceptance_length") else None, ".0%"),
            _fmt(row["schema_valid_rate"] if guided else None, ".0%"),
            _fmt(row["speedup"].get("none"), ".2f") + ("x" if row["speedup"].get("none") else ""),
            _fmt(row["speedup"].get("hf"), ".2f") + ("x" if row["speedup"].get("hf") else ""),
        ]
        for row in rows
    ]
    header = [c for c, _ in COLUMNS]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for r in cells:
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)


def add_speedups(rows: list[dict], baselines: dict[int, dict[str, str]]) -> None:
    """Fill each row's ``speedup``: its tokens/s over each baseline's at the same concurrency.
    ``baselines[c]`` maps a baseline label ("none", "hf") to the row name that plays it at c."""
    by_key = {(r["name"], r["concurrency"]): r for r in rows}
    for row in rows:
        for label, name in baselines.get(row["concurrency"], {}).items():
            base = by_key.get((name, row["concurrency"]))
            if base and base["output_tokens_per_s"] and row["output_tokens_per_s"]:
                row["speedup"][label] = row["output_tokens_per_s"] / base["output_tokens_per_s"]


def write_json(path: str | Path, rows: list[dict], meta: dict) -> None:
    Path(path).write_text(json.dumps({**meta, "results": rows}, indent=1))


def plot(path: str | Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in dict.fromkeys(r["name"] for r in rows):
        pts = sorted(
            (r["per_user_tokens_per_s"], r["output_tokens_per_s"], r["concurrency"])
            for r in rows
            if r["name"] == name and r["per_user_tokens_per_s"]
        )
        if pts:
            ax1.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
            for x, y, c in pts:
                ax1.annotate(f"c={c}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax1.set_xlabel("tokens/s per user")
    ax1.set_ylabel("output tokens/s (total)")
    ax1.set_title("throughput vs per-user speed")
    ax1.legend(fontsize=7)
    drafted = [r for r in rows if r["mean_acceptance_length"]]
    labels = [f"{r['name']}\nc={r['concurrency']}" for r in drafted]
    ax2.bar(range(len(drafted)), [r["mean_acceptance_length"] for r in drafted])
    ax2.set_xticks(range(len(drafted)), labels, fontsize=7, rotation=30, ha="right")
    ax2.set_ylabel("mean acceptance length (tokens per step)")
    ax2.set_title("acceptance length per drafter")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
