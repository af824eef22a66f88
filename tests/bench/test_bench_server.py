"""`specexec bench --server URL`: the same workload through a running server (uvicorn on 127.0.0.1),
side by side with the in-process executor: the same greedy texts, client-side TTFT/TPOT, the server's
speculation counters."""

from __future__ import annotations

import json

from bench_inputs import bench_argv
from served import served_engine
from specexec import Executor, ExecutorConfig
from specexec.cli import main


def test_bench_drives_a_server_with_the_same_prompts_and_gets_the_same_greedy_texts(
    tiny_dir, tmp_path, capsys
):
    config = ExecutorConfig(
        model=tiny_dir,
        dtype="float32",
        progress=False,
        speculative_config={"decoding_type": "NGram", "max_draft_len": 3},
    )
    with served_engine(Executor(config=config)) as (base, engine, _):
        argv = bench_argv(
            tiny_dir, tmp_path, "--dtype", "float32", "--decoding-type", "NGram", "--concurrency", "1,2"
        )
        assert main([*argv, "--server", base, "--baseline", "none"]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {(r["name"], r["concurrency"]): r for r in report["results"]}
    assert {("server", 1), ("server", 2), ("ngram-k3", 1), ("none", 1)} <= set(rows)
    for c in (1, 2):
        server, local = rows[("server", c)], rows[("ngram-k3", c)]
        assert [r["text"] for r in server["requests"]] == [r["text"] for r in local["requests"]]
        assert sum(r["num_output_tokens"] for r in server["requests"]) == 18
        assert all(r["ttft_ms"] is not None and r["tpot_ms"] is not None for r in server["requests"])
        assert server["acceptance_rate"] is not None and server["speedup"]["none"] > 0
    assert "server" in capsys.readouterr().out


def test_bench_refuses_a_url_where_no_server_answers(tmp_path, capsys):
    assert main(["bench", "--server", "http://127.0.0.1:9", "--num-requests", "1"]) == 2
    assert "no OpenAI-compatible server answers" in capsys.readouterr().err


def test_a_server_gets_the_one_stop_set_and_with_ignore_eos_samples_none_of_it(tmp_path):
    from bench_inputs import save_tiny_dir_with_two_stop_ids

    max_tokens = 16

    model = save_tiny_dir_with_two_stop_ids(tmp_path / "model")
    config = ExecutorConfig(model=model, dtype="float32", progress=False)
    runs = {}
    with served_engine(Executor(config=config)) as (base, _, _):
        for flags in ([], ["--ignore-eos"]):
            argv = bench_argv(model, tmp_path, "--dtype", "float32", "--max-tokens", str(max_tokens))
            argv = [a for a in argv if a != "--ignore-eos"] + flags
            assert main([*argv, "--server", base, "--baseline", "none"]) == 0
            results = json.loads((tmp_path / "r.json").read_text())["results"]
            runs[bool(flags)] = {r["name"]: r for r in results}
    stopping, ignoring = runs[False], runs[True]
    assert [r["finish_reason"] for r in stopping["server"]["requests"]] == ["stop"] * 3
    assert [r["num_stop_tokens"] for r in stopping["server"]["requests"]] == [1, 1, 1]
    lengths = [r["num_output_tokens"] for r in stopping["none"]["requests"]]
    assert [r["num_output_tokens"] for r in stopping["server"]["requests"]] == lengths
    assert ignoring["server"]["num_stop_tokens"] == 0 and ignoring["none"]["num_stop_tokens"] == 0
    assert [r["num_output_tokens"] for r in ignoring["server"]["requests"]] == [max_tokens] * 3
    assert ignoring["server"]["stop_tokens_forbidden_by"].startswith("min_tokens = max_tokens")


def test_prompts_sent_as_text_with_the_model_named_give_the_same_greedy_texts(
    tiny_dir, tmp_path, monkeypatch
):
    """``--server-prompts text`` (for routers that take text only): each rendered prompt's ids decoded;
    the server tokenizes them back to the same ids, so the greedy texts are the in-process ones. Every
    request names the served model (a router in front fills in another name where none is sent)."""
    import specexec.server.routes.completions as routes

    seen = []
    parse = routes.parse_completion
    monkeypatch.setattr(
        routes, "parse_completion", lambda body, *a, **k: seen.append(body) or parse(body, *a, **k)
    )
    config = ExecutorConfig(model=tiny_dir, dtype="float32", progress=False)
    with served_engine(Executor(config=config)) as (base, engine, _):
        argv = bench_argv(tiny_dir, tmp_path, "--dtype", "float32")
        assert main([*argv, "--server", base, "--server-prompts", "text", "--baseline", "none"]) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert [r["text"] for r in rows["server"]["requests"]] == [r["text"] for r in rows["none"]["requests"]]
    assert seen and all(isinstance(b["prompt"], str) and b["model"] == "tiny" for b in seen)
