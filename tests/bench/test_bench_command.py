"""`specexec bench` end to end on a tiny model: every configuration and baseline in one process, the
JSON report's keys, the plot, bad input refused before any model loads, and Ctrl-C keeping what was
measured."""

from __future__ import annotations

import json

import pytest
from bench_inputs import bench_argv, write_conversations
from specexec.bench import runner as bench_runner
from specexec.bench.report import LEGEND
from specexec.cli import main

ROW_KEYS = {
    "name",
    "concurrency",
    "num_requests",
    "output_tokens_per_s",
    "mean_acceptance_length",
    "ttft_ms_p50",
    "ttft_ms_p90",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "latency_ms_p50",
    "acceptance_per_position",
    "schema_valid_rate",
    "speedup",
    "requests",
}


def test_configs_and_baselines_side_by_side(tiny_dir, tmp_path, capsys):
    argv = bench_argv(tiny_dir, tmp_path, "--decoding-type", "NGram", "--concurrency", "1,2")
    argv += ["--baseline", "none,hf", "--plot", str(tmp_path / "r.png")]
    assert main(argv) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {(r["name"], r["concurrency"]): r for r in report["results"]}
    assert set(rows) == {
        ("none", 1),
        ("none", 2),
        ("ngram-k3", 1),
        ("ngram-k3", 2),
        ("hf", 1),
        ("hf-prompt-lookup-3", 1),
        ("hf-prompt-lookup-10", 1),
        ("hf-assisted", 1),
        ("hf-batch", 2),
    }
    for row in report["results"]:
        assert set(row) >= ROW_KEYS, ROW_KEYS - set(row)
        assert row["num_requests"] == 3 and len(row["requests"]) == 3
        assert sum(r["num_output_tokens"] for r in row["requests"]) == 18
    assisted = rows[("hf-assisted", 1)]
    assert assisted["ttft_ms_p50"] is not None and assisted["tpot_ms_p50"] is not None
    ngram = rows[("ngram-k3", 1)]
    assert ngram["speedup"]["none"] == pytest.approx(
        ngram["output_tokens_per_s"] / rows[("none", 1)]["output_tokens_per_s"]
    )
    assert ngram["speedup"]["hf"] == pytest.approx(
        ngram["output_tokens_per_s"] / rows[("hf", 1)]["output_tokens_per_s"]
    )
    assert "hf" in rows[("ngram-k3", 2)]["speedup"], "c > 1 compares with generate_batch"
    assert ngram["mean_acceptance_length"] is not None and rows[("none", 1)]["mean_acceptance_length"] is None
    assert ngram["schema_valid_rate"] is not None, "a prompt with a schema gets a validity figure"
    assert report["interrupted"] is False and report["machine"]["torch"]
    assert (tmp_path / "r.png").stat().st_size > 0
    table = capsys.readouterr().out
    assert "ngram-k3" in table and "hf-batch" in table
    assert LEGEND in table, "the legend is printed under the table"
    assert "the median of 3 timed forwards" in table and report["forward_cost"]["repeats"] == 3


def test_guided_rows_compare_with_generate_under_xgrammars_processor(tiny_dir, tmp_path, capsys):
    argv = bench_argv(tiny_dir, tmp_path, "--guided", "--baseline", "none,hf")
    argv.remove("--ignore-eos")  # the processor stops masking once the schema is complete
    assert main(argv) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {(r["name"], r["concurrency"]): r for r in report["results"]}
    assert set(rows) == {("none", 1), ("hf-guided", 1)}
    hf = rows[("hf-guided", 1)]
    assert hf["engine"].startswith("transformers generate + xgrammar")
    assert hf["schema_valid_rate"] is not None  # the one prompt with a schema is checked
    none = rows[("none", 1)]
    assert none["speedup"]["hf"] == pytest.approx(none["output_tokens_per_s"] / hf["output_tokens_per_s"])
    assert "hf-guided" in capsys.readouterr().out


def test_bad_config_fails_before_any_model_loads(tiny_dir, tmp_path, monkeypatch, capsys):
    import specexec.executor.model.model_loader as loader

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loader, "load_model", no_loading)
    bad = tmp_path / "bad.yaml"
    bad.write_text("speculative_config: {decoding_type: NGram, max_draft_len: 99}\n")
    assert main(bench_argv(tiny_dir, tmp_path, "--config", str(bad))) == 2
    assert "max_draft_len" in capsys.readouterr().err
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("speculative_config: {decoding_type: NoSuchDrafter}\n")
    assert main(bench_argv(tiny_dir, tmp_path, "--config", str(unknown))) == 2
    assert "unknown speculative_config.decoding_type" in capsys.readouterr().err
    argv = bench_argv(tiny_dir, tmp_path)
    argv[argv.index("--dataset") + 1] = "nosuchset"
    assert main(argv) == 2
    assert "unknown dataset" in capsys.readouterr().err
    assert main(bench_argv(tiny_dir, tmp_path, "--concurrency", "0")) == 2


def test_ctrl_c_keeps_what_was_measured(tiny_dir, tmp_path, monkeypatch):
    def interrupted(self, bar):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_runner.BenchRunner, "_run_hf", interrupted)
    assert main(bench_argv(tiny_dir, tmp_path, "--baseline", "none,hf")) == 130
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["interrupted"] is True
    assert [r["name"] for r in report["results"]] == ["none"]


def test_guided_schema_validity_is_the_executors_verdict_and_a_refused_request_counts_invalid():
    from specexec.bench.engines.specexec_hf import record_of
    from specexec.executor.engine.request import FinishReason, RequestOutput
    from specexec.prompt_sets.datasets import BenchPrompt

    prompt = BenchPrompt("p", [{"role": "user", "content": "x"}], {"type": "object"})

    def output(reason, valid, text="{}"):
        return RequestOutput(
            "r", text, [1], reason, guided_valid=valid, error="no" if valid is None else None
        )

    assert record_of(prompt, output(FinishReason.STOP, True), guided=True).schema_valid is True
    assert record_of(prompt, output(FinishReason.LENGTH, False, '{"a'), guided=True).schema_valid is False
    refused = output(FinishReason.ERROR, None, "")  # e.g. a keyword guided decoding cannot enforce
    assert record_of(prompt, refused, guided=True).schema_valid is False
    assert record_of(prompt, output(FinishReason.STOP, None), guided=False).schema_valid is True  # its text


def test_a_bad_drafter_option_in_a_bench_config_fails_before_any_model_loads(
    tiny_dir, tmp_path, monkeypatch, capsys
):
    import specexec.executor.model.model_loader as loader

    monkeypatch.setattr(loader, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    bad = tmp_path / "bad.yaml"
    bad.write_text("speculative_config: {decoding_type: Eagle, max_draft_len: 3, eagle3_one_model: true}\n")
    assert main(bench_argv(tiny_dir, tmp_path, "--config", str(bad))) == 2
    assert "eagle3_one_model" in capsys.readouterr().err


@pytest.mark.slow
def test_graph_bench_compares_graphs_on_and_off_side_by_side(tmp_path, capsys):
    """Without a GPU the eager-replay backend stands in for the graphs: the table's rows are there, the
    graphs-on rows replayed the target's decode steps, the capture is reported."""
    from specexec.bench.graph_bench import main as graph_bench

    out = tmp_path / "graphs.json"
    args = "--device cpu --models tiny --drafters none,ngram --batches 2 --max-tokens 6 --num-prompts 2"
    assert graph_bench([*args.split(), "--repeats", "1", "--output", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    keys = {(r["drafter"], r["guided"], r["graphs"]) for r in rows}
    assert keys == {
        (d, g, on) for d, g in (("none", False), ("ngram", False), ("ngram", True)) for on in (True, False)
    }
    for r in rows:
        assert r["tokens_per_s"] > 0 and 0 <= r["same_tokens"] <= 1
        assert (r["replays"] > 0 and r["capture_s"] > 0) if r["graphs"] else r["replays"] == 0
        assert (r["mask_wait_ms"] is not None) == r["guided"]
    assert "on/off" in capsys.readouterr().out


def test_graph_bench_rows_per_forward_with_graphs_on_only(tmp_path, capsys):
    """``--model-impls`` gives each forward its own rows (the one that ran, said per row); ``--graphs on``
    runs only the captured path, so no row compares tokens with graphs off."""
    from specexec.bench.graph_bench import main as graph_bench

    out = tmp_path / "graphs.json"
    args = "--device cpu --models tiny --drafters none --batches 1 --max-tokens 4 --num-prompts 1 --no-guided"
    extra = [
        "--model-impls",
        "transformers,specexec",
        "--graphs",
        "on",
        "--repeats",
        "1",
        "--output",
        str(out),
    ]
    assert graph_bench([*args.split(), *extra]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model_impl"], r["graphs"], r["same_tokens"]) for r in rows] == [
        ("transformers", True, None),
        ("specexec", True, None),
    ]
    with pytest.raises(SystemExit) as exit_info:
        graph_bench([*args.split(), "--graphs", "sideways"])
    assert exit_info.value.code == 2 and "--graphs: on, off or on,off" in capsys.readouterr().err


def test_conversations_with_and_without_prefix_caching(tiny_dir, tmp_path, capsys):
    config = tmp_path / "pages.yaml"
    config.write_text("name: small-pages\nblock_size: 4\n")
    argv = bench_argv(tiny_dir, tmp_path, "--config", str(config), "--prefix-caching", "both")
    argv[argv.index("--dataset") + 1] = write_conversations(tmp_path / "conversations.jsonl")
    argv[argv.index("--num-requests") + 1] = "2"
    argv += ["--concurrency", "1,2", "--baseline", "none"]
    assert main(argv) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {(r["name"], r["concurrency"]): r for r in report["results"]}
    assert set(rows) == {
        (n, c) for n in ("none", "none+cache", "small-pages", "small-pages+cache") for c in (1, 2)
    }
    for (name, _c), row in rows.items():
        assert [r["turn"] for r in row["requests"]] == [1, 2, 3, 1, 2, 3], "each conversation's 3 turns"
        assert row["requests"][1]["num_prompt_tokens"] > row["requests"][0]["num_prompt_tokens"] + 6
        assert row["ttft_later_turns_ms_p50"] is not None and row["prefix_caching"] == name.endswith("+cache")
        if name.endswith("+cache"):  # later turns reuse their history (every run starts cold)
            assert row["cached_share"] > 0 and row["requests"][0]["num_cached_tokens"] == 0
            assert all(r["num_cached_tokens"] > 0 for r in row["requests"] if r["turn"] > 1)
        else:
            assert row["cached_share"] == 0
    out = capsys.readouterr().out
    assert "ttft 2+ ms" in out and "cached%" in out
    assert "prefix caching, small-pages c=2: TTFT of turns 2+" in out


def test_conversations_refuse_the_single_prompt_baselines(tiny_dir, tmp_path, capsys):
    argv = bench_argv(tiny_dir, tmp_path, "--baseline", "none,hf")
    argv[argv.index("--dataset") + 1] = write_conversations(tmp_path / "conversations.jsonl")
    assert main(argv) == 2
    assert (
        "specexec's configurations and servers (--server, llama-server) run; drop hf"
        in capsys.readouterr().err
    )


def test_tool_calls_are_sent_with_their_tools_and_held_to_the_calls_schema(tiny_dir, tmp_path):
    argv = bench_argv(tiny_dir, tmp_path, "--tool-choice", "required", "--decoding-type", "NGram")
    argv[argv.index("--dataset") + 1] = "bfcl"
    argv[argv.index("--num-requests") + 1] = "2"
    argv[argv.index("--max-tokens") + 1] = "24"
    argv.remove("--ignore-eos")
    assert main(argv) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {r["name"]: r for r in report["results"]}
    assert set(rows) == {"none", "ngram-k3"}
    for row in rows.values():
        assert row["guided"] and row["schema_valid_rate"] is not None
        for r in row["requests"]:  # the tools are in the prompt (the Hermes system message)
            assert r["num_prompt_tokens"] > 40 and r["schema_valid"] is (r["finish_reason"] == "stop")
    argv = bench_argv(tiny_dir, tmp_path, "--tool-choice", "required")
    assert main(argv) == 2, "a dataset without tools is refused"


def test_tensor_parallel_sizes_run_side_by_side_with_the_broadcast_share(tiny_dir, tmp_path, capsys):
    argv = bench_argv(tiny_dir, tmp_path, "--tensor-parallel-size", "1,2", "--dtype", "float32")
    assert main(argv) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {r["name"]: r for r in report["results"]}
    assert set(rows) == {"none", "none-tp2"}
    assert rows["none-tp2"]["tensor_parallel_size"] == 2 and 0 < rows["none-tp2"]["tp_broadcast_share"] < 1
    assert rows["none"]["tp_broadcast_share"] is None
    assert [r["text"] for r in rows["none-tp2"]["requests"]] == [r["text"] for r in rows["none"]["requests"]]
    assert "the step broadcast" in capsys.readouterr().out
