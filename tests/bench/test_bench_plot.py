"""The benchmark's plot, read back from its matplotlib figure: every y-axis from 0, the 1.0x reference
line, every row present; and a clear message, before any run, when matplotlib is missing."""

from __future__ import annotations

import sys

import pytest
from specexec.bench.plot import FAMILY_COLORS, build_figure, check_plotting, row_label
from specexec.bench.records import RequestRecord, summarize
from specexec.bench.report import add_speedups
from specexec.cli import main


def make_rows(names=("none", "ngram-k3", "hf", "hf-assisted")) -> list[dict]:
    """Each name at c=1 and c=4 (hf-assisted only at c=1, as the bench runs it), then hf-batch at c=4."""
    engines = {"none": "specexec", "ngram-k3": "specexec"}
    rows = []
    for name, tpot, steps, accepted in [
        ("none", 30.0, 0, 0),
        ("ngram-k3", 20.0, 5, 8),
        ("hf", 40.0, 0, 0),
        ("hf-assisted", 25.0, 0, 0),
    ]:
        if name not in names:
            continue
        for c in (1,) if name == "hf-assisted" else (1, 4):
            record = RequestRecord(
                "p",
                10,
                16,
                500.0,
                80.0,
                tpot,
                num_decode_steps=steps,
                num_draft_tokens=3 * steps,
                num_accepted_tokens=accepted,
            )
            extra = {"engine": engines.get(name, "transformers generate")}
            rows.append(summarize(name, c, [record], 0.5 * (1 + c / 10) * tpot / 30, extra))
    batch = summarize("hf-batch", 4, [RequestRecord("p", 10, 16, 500.0)], 0.4)  # no TPOT measured
    batch["engine"] = "transformers generate_batch"
    rows.append(batch)
    add_speedups(rows, {c: {"none": "none"} for c in (1, 4)})
    return rows


def reference_lines(ax) -> list:
    return [line for line in ax.get_lines() if list(line.get_ydata()) == [1.0, 1.0]]


def test_axes_start_at_zero_the_reference_line_is_there_and_every_row_is_present():
    rows = make_rows()
    fig = build_figure(rows, "specbench, 2 requests")
    throughput, speedup, acceptance = fig.axes
    for ax in fig.axes:
        assert ax.get_ylim()[0] == 0, ax.get_title()
        assert ax.get_title() and ax.get_ylabel()
    assert throughput.get_xlim()[0] == 0 and "tokens/s" in throughput.get_xlabel()
    legend = [t.get_text() for t in throughput.get_legend().get_texts()]
    assert legend == ["none", "ngram-k3", "hf", "hf-assisted (c=1)", "hf-batch (c=4)"]
    labels = [t.get_text() for t in speedup.get_xticklabels()]
    assert labels == [f"{r['name']} c={r['concurrency']}" for r in rows], "a row is missing"
    assert len(reference_lines(speedup)) == 1 and len(reference_lines(acceptance)) == 1
    heights = [p.get_height() for p in speedup.patches]
    assert heights[0] == pytest.approx(1.0) and heights[2] == pytest.approx(rows[2]["speedup"]["none"])
    assert "(none)" in speedup.get_title()
    assert [t.get_text() for t in acceptance.get_xticklabels()] == ["ngram-k3 c=1", "ngram-k3 c=4"]
    assert fig.texts[0].get_text() == "specbench, 2 requests"


def test_bars_are_coloured_by_engine_and_the_legend_names_the_colours():
    from matplotlib.colors import to_rgba

    rows = make_rows()
    speedup = build_figure(rows).axes[1]
    colors = {r["name"]: p.get_facecolor() for r, p in zip(rows, speedup.patches)}
    assert colors["none"] == to_rgba(FAMILY_COLORS["specexec, no drafts"])
    assert colors["ngram-k3"] == to_rgba(FAMILY_COLORS["specexec with drafts"])
    assert colors["hf-assisted"] == colors["hf-batch"] == to_rgba(FAMILY_COLORS["Hugging Face transformers"])
    legend = [t.get_text() for t in speedup.get_legend().get_texts()]
    assert legend == ["1.0x: as fast as the baseline", *list(FAMILY_COLORS)[:3]]


def test_without_a_none_row_the_speedup_is_over_the_first_row_and_says_so():
    rows = make_rows(names=("hf", "hf-assisted"))
    fig = build_figure(rows)
    speedup, acceptance = fig.axes[1], fig.axes[2]
    assert [row_label(r) for r in rows] == ["hf c=1", "hf c=4", "hf-assisted c=1", "hf-batch c=4"]
    assisted_over_hf = rows[2]["output_tokens_per_s"] / rows[0]["output_tokens_per_s"]
    batch_over_hf = rows[3]["output_tokens_per_s"] / rows[1]["output_tokens_per_s"]
    heights = [p.get_height() for p in speedup.patches]
    assert heights == pytest.approx([1.0, 1.0, assisted_over_hf, batch_over_hf])
    assert "hf" in speedup.get_title() and "none" not in speedup.get_title()
    assert acceptance.texts[0].get_text() == "no drafting rows"


def test_without_matplotlib_plot_names_the_extra_before_any_run(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ValueError, match=r"pip install 'specexec\[bench\]'"):
        check_plotting()
    assert main(["bench", "--plot", "x.png", "--model", "/does/not/exist"]) == 2
    assert "specexec[bench]" in capsys.readouterr().err
