"""``specexec bench --repeats N``: every configuration N times, interleaved; one row per configuration
and concurrency with each figure's median and spread, every pass kept in the JSON."""

from __future__ import annotations

import json

from bench_inputs import bench_argv
from specexec.bench import runner as bench_runner
from specexec.bench.records import RequestRecord, summarize
from specexec.bench.report import add_speedups, format_table
from specexec.bench.workload.repeats import combine_passes
from specexec.cli import main


def pass_row(name: str, pass_index: int, wall_s: float, num_stop_tokens: int = 0) -> dict:
    records = [RequestRecord(f"p{i}", 10, 4, 100.0, 20.0 + pass_index, 10.0) for i in range(2)]
    for record in records:
        record.num_stop_tokens = num_stop_tokens
    row = summarize(name, 1, records, wall_s)
    row["pass"] = pass_index
    return row


def test_each_figure_becomes_the_median_of_its_passes_with_their_spread():
    rows = [pass_row("none", p, wall) for p, wall in enumerate((1.0, 2.0, 4.0))]
    rows += [
        pass_row("ngram", p, wall, stops) for p, (wall, stops) in enumerate(((0.5, 0), (0.5, 1), (1.0, 0)))
    ]
    for p in range(3):
        add_speedups([r for r in rows if r["pass"] == p], {1: {"none": "none"}})
    none, ngram = combine_passes(rows)
    assert none["num_passes"] == 3 and [r["pass"] for r in none["passes"]] == [0, 1, 2]
    assert none["output_tokens_per_s"] == 4.0  # 8 tokens in 1, 2 and 4 s: 8, 4, 2 tok/s
    assert none["spread"]["output_tokens_per_s"] == [2.0, 8.0]
    assert none["ttft_ms_p50"] == 21.0 and none["spread"]["ttft_ms_p50"] == [20.0, 22.0]
    assert ngram["speedup"]["none"] == 4.0 and ngram["spread"]["speedup.none"] == [2.0, 4.0]  # 2x, 4x, 4x
    assert ngram["num_stop_tokens"] == 2, "the stop tokens of every pass add up: one in any pass shows"
    assert "requests" not in ngram and all(len(p["requests"]) == 2 for p in ngram["passes"])


def test_the_table_shows_the_median_then_the_spread():
    rows = combine_passes([pass_row("none", p, wall) for p, wall in enumerate((1.0, 2.0, 4.0))])
    cells = format_table(rows).splitlines()[2]
    assert "4.0 (2.0-8.0)" in cells and "21 (20-22)" in cells
    single = format_table([pass_row("none", 0, 1.0)]).splitlines()[2]
    assert "(" not in single, "one pass: no spread"


def test_repeats_run_the_configurations_interleaved_and_keep_every_pass(
    tiny_dir,
    tmp_path,
    monkeypatch,
):
    order = []
    real = bench_runner.run_specexec

    def logged(executor, work, concurrency, *rest):
        if len(work.prompts) == 3:  # (not a warm-up)
            order.append("ngram" if executor.config.speculative_config else "none")
        return real(executor, work, concurrency, *rest)

    monkeypatch.setattr(bench_runner, "run_specexec", logged)
    argv = bench_argv(tiny_dir, tmp_path, "--decoding-type", "NGram", "--repeats", "2", "--warmup", "0")
    assert main(argv) == 0
    assert order == ["none", "ngram", "none", "ngram"]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["repeats"] == 2
    rows = {r["name"]: r for r in report["results"]}
    assert set(rows) == {"none", "ngram-k3"}
    for row in rows.values():
        assert row["num_passes"] == 2 and [p["pass"] for p in row["passes"]] == [0, 1]
        assert all(len(p["requests"]) == 3 for p in row["passes"])
        assert row["spread"]["output_tokens_per_s"][0] <= row["output_tokens_per_s"]
    ratios = sorted(p["speedup"]["none"] for p in rows["ngram-k3"]["passes"])
    assert rows["ngram-k3"]["speedup"]["none"] == sum(ratios) / 2, "the median of each pass's own ratio"


def test_repeats_below_one_are_refused(tiny_dir, tmp_path, capsys):
    assert main(bench_argv(tiny_dir, tmp_path, "--repeats", "0")) == 2
    assert "--repeats" in capsys.readouterr().err
