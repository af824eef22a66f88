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


LEGEND = (
    "tok/s       all requests' output tokens / wall time, first sent to last done (prefill and gaps included)\n"
    "tok/s/user  mean over requests of 1 / TPOT: decoding only, no prefill, so at c=1 it is above tok/s\n"
    "ttft p50    median time from a request's submission to its first output token (queueing, prefill)\n"
    "tpot p50    median over requests of (finish - first token) / (output tokens - 1)\n"
    "acc.len     (decode steps + accepted drafts) / decode steps: tokens per target forward\n"
    "draft%      drafting time / (drafting + target-forward time)\n"
    "valid       share of outputs valid against their prompt's schema (--guided only, else -)\n"
    "vs none     tok/s over specexec's without drafts at the same concurrency\n"
    "vs hf       tok/s over HF generate's (c=1; hf-guided with --guided) or generate_batch's (c>1)\n"
    "timing: hf c=1 rows with a generate streamer (hf-assisted's first chunk brings its first accepted\n"
    "        drafts along); hf-batch from generate_batch's timestamps; server rows at the client"
)


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


MATPLOTLIB_MISSING = "--plot needs matplotlib: pip install 'specexec[bench]'"


def check_plotting() -> None:
    """Raise ValueError naming the extra when matplotlib is missing (before a run, not after it)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ValueError(MATPLOTLIB_MISSING) from exc


def plot(path: str | Path, rows: list[dict]) -> None:
    fig = build_figure(rows)
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)


def build_figure(rows: list[dict]):
    """Three panels, every y-axis from 0: total against per-user tokens/s (one line per engine, a
    point per concurrency); each row's speed-up over ``none`` at its concurrency, with the 1.0x line;
    the drafters' acceptance lengths, with the 1-token line of decoding without drafts."""
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 5))
    _throughput_panel(ax1, rows)
    _speedup_panel(ax2, rows)
    _acceptance_panel(ax3, rows)
    fig.tight_layout()
    return fig


def _row_label(row: dict) -> str:
    return f"{row['name']} c={row['concurrency']}"


def _throughput_panel(ax, rows: list[dict]) -> None:
    for name in dict.fromkeys(r["name"] for r in rows):
        pts = sorted(
            (r["per_user_tokens_per_s"] or 0.0, r["output_tokens_per_s"] or 0.0, r["concurrency"])
            for r in rows
            if r["name"] == name
        )
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        for x, y, c in pts:
            ax.annotate(f"c={c}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("tokens/s per user (1 / TPOT; 0 = not measured)")
    ax.set_ylabel("output tokens/s, all requests")
    ax.set_title("throughput against per-user speed")
    ax.legend(fontsize=7)


def _speedup_panel(ax, rows: list[dict]) -> None:
    """Every row's tokens/s over the ``none`` row at the same concurrency (or, in a run without it, over
    the first row at that concurrency)."""
    ratios = []
    for row in rows:
        base = next((r for r in rows if r["name"] == "none" and r["concurrency"] == row["concurrency"]), None)
        base = base or next(r for r in rows if r["concurrency"] == row["concurrency"])
        ok = base["output_tokens_per_s"] and row["output_tokens_per_s"]
        ratios.append(row["output_tokens_per_s"] / base["output_tokens_per_s"] if ok else 0.0)
    bars = ax.bar(
        range(len(rows)), ratios, color=["tab:gray" if r["name"] == "none" else "tab:blue" for r in rows]
    )
    ax.bar_label(bars, [f"{v:.2f}x" for v in ratios], fontsize=7)
    ax.axhline(1.0, color="tab:red", linestyle="--", linewidth=1, label="1.0x = the baseline")
    ax.set_xticks(range(len(rows)), [_row_label(r) for r in rows], fontsize=7, rotation=35, ha="right")
    ax.set_ylim(bottom=0, top=max([1.0, *ratios]) * 1.15)
    ax.set_ylabel("output tokens/s over the no-draft run (x)")
    ax.set_title("speed-up over specexec without drafts, same concurrency")
    ax.legend(fontsize=7, loc="upper left")


def _acceptance_panel(ax, rows: list[dict]) -> None:
    drafted = [r for r in rows if r["mean_acceptance_length"]]
    bars = ax.bar(range(len(drafted)), [r["mean_acceptance_length"] for r in drafted], color="tab:green")
    ax.bar_label(bars, [f"{r['mean_acceptance_length']:.2f}" for r in drafted], fontsize=7)
    ax.axhline(1.0, color="tab:red", linestyle="--", linewidth=1, label="1 token per step = no drafts")
    ax.set_xticks(range(len(drafted)), [_row_label(r) for r in drafted], fontsize=7, rotation=35, ha="right")
    top = max([1.0, *(r["mean_acceptance_length"] for r in drafted)])
    ax.set_ylim(bottom=0, top=top * 1.15)
    ax.set_ylabel("tokens per target forward (acceptance length)")
    ax.set_title("acceptance length of the drafting rows")
    ax.legend(fontsize=7, loc="upper left")
