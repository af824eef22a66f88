"""The benchmark's plot: three panels read side by side, every y-axis from 0 so gaps look their size.

1. total against per-user tokens/s, one line per engine and a point per concurrency (up and right is
   better);
2. every row's tokens/s over its baseline's at the same concurrency (``none``, specexec without drafts),
   bars coloured by engine, with the 1.0x line;
3. the drafting specexec rows' acceptance lengths (HF reports none), with the 1-token line of decoding
   without drafts.
"""

from __future__ import annotations

from pathlib import Path

MATPLOTLIB_MISSING = "--plot needs matplotlib: pip install 'specexec[bench]'"
FAMILY_COLORS = {
    "specexec, no drafts": "tab:gray",
    "specexec with drafts": "tab:blue",
    "Hugging Face transformers": "tab:orange",
    "other engines": "tab:purple",
}
MARKERS = "osD^vP*X"  #: rows of one family in the first panel, in order


def check_plotting() -> None:
    """Raise ValueError naming the extra when matplotlib is missing (before a run, not after it)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ValueError(MATPLOTLIB_MISSING) from exc


def plot(path: str | Path, rows: list[dict], title: str | None = None) -> None:
    import matplotlib.pyplot as plt

    fig = build_figure(rows, title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_figure(rows: list[dict], title: str | None = None):
    """The figure ``plot`` saves; ``title`` (the workload, say) goes above the panels."""
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drafted = [r for r in rows if r["mean_acceptance_length"]]
    widths = [1.0, max(1.0, len(rows) / 9), max(0.6, len(drafted) / 9)]
    fig, (ax1, ax2, ax3) = plt.subplots(
        1, 3, figsize=(5.5 * sum(widths), 5.5), gridspec_kw={"width_ratios": widths}
    )
    _throughput_panel(ax1, rows)
    _speedup_panel(ax2, rows)
    _acceptance_panel(ax3, drafted)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def row_label(row: dict) -> str:
    return f"{row['name']} c={row['concurrency']}"


def _throughput_panel(ax, rows: list[dict]) -> None:
    """A line per engine, coloured by family as the bars are and told apart within it by its marker; one
    with a single concurrency says it in the legend instead of beside the dot."""
    num_in_family: dict[str, int] = {}
    for name in dict.fromkeys(r["name"] for r in rows):
        mine = [r for r in rows if r["name"] == name]
        family = _family(mine[0])
        marker = MARKERS[num_in_family.get(family, 0) % len(MARKERS)]
        num_in_family[family] = num_in_family.get(family, 0) + 1
        points = sorted(
            (r["per_user_tokens_per_s"] or 0.0, r["output_tokens_per_s"] or 0.0, r["concurrency"])
            for r in mine
        )
        label = name if len(points) > 1 else f"{name} (c={points[0][2]})"
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        ax.plot(xs, ys, marker=marker, color=FAMILY_COLORS[family], label=label)
        for x, y, c in points if len(points) > 1 else ():
            ax.annotate(f"c={c}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("tokens/s per user (mean 1 / TPOT; 0 = not measured)")
    ax.set_ylabel("output tokens/s, all requests")
    ax.set_title("total against per-user speed\n(up and right is better)")
    ax.legend(fontsize=7)


def _family(row: dict) -> str:
    engine = row.get("engine", "")
    if row["name"] == "none":
        return "specexec, no drafts"
    if engine == "specexec":
        return "specexec with drafts"
    return "Hugging Face transformers" if engine.startswith("transformers") else "other engines"


def baseline_row(rows: list[dict], concurrency: int) -> dict:
    """The row a speed-up is over: ``none`` at that concurrency, else the first row there."""
    same = [r for r in rows if r["concurrency"] == concurrency]
    return next((r for r in same if r["name"] == "none"), same[0])


def _speedup_panel(ax, rows: list[dict]) -> None:
    from matplotlib.patches import Patch

    bases = [baseline_row(rows, r["concurrency"]) for r in rows]
    ratios = [
        r["output_tokens_per_s"] / b["output_tokens_per_s"]
        if b["output_tokens_per_s"] and r["output_tokens_per_s"]
        else 0.0
        for r, b in zip(rows, bases)
    ]
    families = [_family(r) for r in rows]
    bars = ax.bar(range(len(rows)), ratios, color=[FAMILY_COLORS[f] for f in families])
    ax.bar_label(bars, [f"{v:.2f}x" for v in ratios], fontsize=7)
    line = ax.axhline(
        1.0, color="tab:red", linestyle="--", linewidth=1, label="1.0x: as fast as the baseline"
    )
    shown = [Patch(color=FAMILY_COLORS[f], label=f) for f in FAMILY_COLORS if f in families]
    ax.legend(handles=[line, *shown], fontsize=7, loc="upper left")
    ax.set_xticks(range(len(rows)), [row_label(r) for r in rows], fontsize=7, rotation=35, ha="right")
    ax.set_ylim(bottom=0, top=max([1.0, *ratios]) * 1.25)  # room for the legend above the bars
    names = sorted({b["name"] for b in bases})
    over = "specexec without drafts (none)" if names == ["none"] else " / ".join(names)
    ax.set_ylabel("output tokens/s over the baseline's (x)")
    ax.set_title(f"speed-up over {over}\nat the same concurrency")


def _acceptance_panel(ax, drafted: list[dict]) -> None:
    lengths = [r["mean_acceptance_length"] for r in drafted]
    bars = ax.bar(range(len(drafted)), lengths, color=FAMILY_COLORS["specexec with drafts"])
    ax.bar_label(bars, [f"{v:.2f}" for v in lengths], fontsize=7)
    ax.axhline(1.0, color="tab:red", linestyle="--", linewidth=1, label="1 token per forward = no drafts")
    ax.set_xticks(range(len(drafted)), [row_label(r) for r in drafted], fontsize=7, rotation=35, ha="right")
    if not drafted:
        ax.text(0.5, 0.5, "no drafting rows", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylim(bottom=0, top=max([1.0, *lengths]) * 1.25)
    ax.set_ylabel("tokens per target forward (acceptance length)")
    ax.set_title("acceptance length\nof specexec's drafting rows")
    ax.legend(fontsize=7, loc="upper left")
