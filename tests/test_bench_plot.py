"""The benchmark's plot, read back from its matplotlib figure: every y-axis from 0, the 1.0x reference
line, every row present; and a clear message, before any run, when matplotlib is missing."""

from __future__ import annotations

import sys

import pytest
from specexec.bench.records import RequestRecord, summarize
from specexec.bench.report import add_speedups, build_figure, check_plotting
from specexec.cli import main


def make_rows() -> list[dict]:
    rows = []
    for name, tpot, steps, accepted in [
        ("none", 30.0, 0, 0),
        ("ngram-k3", 20.0, 5, 8),
        ("hf", 40.0, 0, 0),
        ("hf-assisted", 25.0, 0, 0),
    ]:
        for c in (1, 4):
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
            rows.append(summarize(name, c, [record], 0.5 * (1 + c / 10) * tpot / 30))
    rows.append(summarize("hf-batch", 4, [RequestRecord("p", 10, 16, 500.0)], 0.4))  # no TPOT measured
    add_speedups(rows, {c: {"none": "none"} for c in (1, 4)})
    return rows


def test_axes_start_at_zero_the_reference_line_is_there_and_every_row_is_present():
    rows = make_rows()
    fig = build_figure(rows)
    throughput, speedup, acceptance = fig.axes
    for ax in fig.axes:
        assert ax.get_ylim()[0] == 0, ax.get_title()
    assert throughput.get_xlim()[0] == 0
    legend = {t.get_text() for t in throughput.get_legend().get_texts()}
    assert legend == {r["name"] for r in rows}
    labels = [t.get_text() for t in speedup.get_xticklabels()]
    assert labels == [f"{r['name']} c={r['concurrency']}" for r in rows], "a row is missing"
    for ax in (speedup, acceptance):
        assert any(list(line.get_ydata()) == [1.0, 1.0] for line in ax.get_lines()), "no 1.0 reference line"
    heights = [p.get_height() for p in speedup.patches]
    assert heights[0] == pytest.approx(1.0) and heights[2] == pytest.approx(rows[2]["speedup"]["none"])
    assert [t.get_text() for t in acceptance.get_xticklabels()] == ["ngram-k3 c=1", "ngram-k3 c=4"]
    assert all(ax.get_title() and ax.get_ylabel() for ax in fig.axes)


def test_without_matplotlib_plot_names_the_extra_before_any_run(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ValueError, match=r"pip install 'specexec\[bench\]'"):
        check_plotting()
    assert main(["bench", "--plot", "x.png", "--model", "/does/not/exist"]) == 2
    assert "specexec[bench]" in capsys.readouterr().err
