"""``--baseline llama-server``: the bench starts llama.cpp's server on the same GGUF and threads, drives it
with its own request fields (``ignore_eos``, no vLLM extensions), puts its rows beside the others (one a
``--llama-server-args``), and stops it; refused clearly without a binary. Tested against a stand-in
binary that speaks llama-server's HTTP surface and records its command line and every request."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
import torch
from bench_inputs import write_conversations, write_dataset
from gguf_files import write_gguf
from specexec.cli import main

#: a stand-in for llama-server: /health, /v1/models, streamed /v1/completions ("x" a token, max_tokens of
#: them with ignore_eos, else 2) and /metrics with llama-server's speculation counters; it appends its
#: argv and pid, then each request's body, to $FAKE_LLAMA_SERVER_LOG; with $FAKE_LLAMA_SERVER_DIE_AT=k it
#: exits in the middle of its k-th response
FAKE_SERVER = textwrap.dedent(
    """
    import json, os, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    LOG = os.environ["FAKE_LLAMA_SERVER_LOG"]
    def log(entry):
        with open(LOG, "a") as f:
            f.write(json.dumps(entry) + "\\n")
    argv = sys.argv[1:]
    log({"argv": argv, "pid": os.getpid()})
    drafted = [0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def send(self, body, kind="application/json"):
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self.send(b'{"status": "ok"}')
            elif self.path == "/v1/models":
                self.send(json.dumps({"data": [{"id": "tiny.gguf"}]}).encode())
            elif self.path == "/metrics":
                text = (f"llamacpp:spec_decode_num_draft_tokens_total {drafted[0]}\\n"
                        f"llamacpp:spec_decode_num_accepted_tokens_total {drafted[0] // 2}\\n")
                self.send(text.encode(), "text/plain")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            log({"body": body})
            n = body["max_tokens"] if body.get("ignore_eos") else 2
            drafted[0] += 4
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            if drafted[0] // 4 == int(os.environ.get("FAKE_LLAMA_SERVER_DIE_AT", 0)):
                self.wfile.write(b'data: {"choices": [{"text": "x", "index": 0}]}\\n\\n')
                self.wfile.flush()
                os._exit(3)  # (a crash mid-stream)
            for i in range(n):
                last = i == n - 1
                choice = {"text": "x", "index": 0, "finish_reason": ("length" if n == body["max_tokens"]
                          else "stop") if last else None}
                self.wfile.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\\n\\n")
            usage = {"completion_tokens": n, "prompt_tokens": len(body["prompt"])}
            self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\\n\\n")
            self.wfile.write(b"data: [DONE]\\n\\n")

    port = int(argv[argv.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)


@pytest.fixture
def fake_llama_server(tmp_path, monkeypatch):
    """The stand-in binary, as $LLAMA_SERVER; returns a function reading what it recorded."""
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
    binary.chmod(0o755)
    log = tmp_path / "llama-server.log"
    monkeypatch.setenv("LLAMA_SERVER", str(binary))
    monkeypatch.setenv("FAKE_LLAMA_SERVER_LOG", str(log))
    return lambda: [json.loads(line) for line in log.read_text().splitlines()]


def bench_on_a_gguf(tmp_path, *extra: str) -> list[str]:
    model = tmp_path / "tiny.gguf"
    write_gguf(model, "qwen2-tied")
    return [
        "bench", "--model", str(model), "--dataset", write_dataset(tmp_path / "prompts.jsonl"),
        "--num-requests", "3", "--max-tokens", "5", "--warmup", "0", "--output", str(tmp_path / "r.json"),
        *extra,
    ]  # fmt: skip


def test_each_llama_server_gets_the_gguf_the_threads_its_args_and_the_same_prompts_then_stops(
    tmp_path, fake_llama_server, capsys
):
    argv = bench_on_a_gguf(
        tmp_path, "--ignore-eos", "--concurrency", "1,2", "--baseline", "none,llama-server",
        "--llama-server-args", "", "--llama-server-args", "--spec-type ngram-mod --draft-max 4",
    )  # fmt: skip
    assert main(argv) == 0
    rows = {
        (r["name"], r["concurrency"]): r for r in json.loads((tmp_path / "r.json").read_text())["results"]
    }
    assert {("llama-server", 1), ("llama-server", 2), ("none", 1), ("none", 2)} <= set(rows)
    spec = rows[("llama-server --spec-type ngram-mod --draft-max 4", 2)]
    assert spec["acceptance_rate"] == pytest.approx(0.5)
    assert spec["stop_tokens_forbidden_by"].startswith("ignore_eos")
    for c in (1, 2):  # every request ran to max tokens, as the in-process ones did
        assert [r["num_output_tokens"] for r in rows[("llama-server", c)]["requests"]] == [5, 5, 5]
        assert [r["num_output_tokens"] for r in rows[("none", c)]["requests"]] == [5, 5, 5]
    entries = fake_llama_server()
    starts = [e for e in entries if "argv" in e]
    assert len(starts) == 2  # one server a variant, started once
    for start in starts:
        args = start["argv"]
        assert args[args.index("-m") + 1] == str(tmp_path / "tiny.gguf")
        assert args[args.index("--host") + 1] == "127.0.0.1"
        assert args[args.index("--parallel") + 1] == "2"  # a slot per request in flight
        assert args[args.index("-t") + 1] == args[args.index("-tb") + 1] == str(torch.get_num_threads())
        with pytest.raises(ProcessLookupError):  # stopped after its rows
            os.kill(start["pid"], 0)
    assert starts[1]["argv"][-4:] == ["--spec-type", "ngram-mod", "--draft-max", "4"]
    bodies = [e["body"] for e in entries if "body" in e]
    assert len(bodies) == 2 * 2 * 3
    assert all(
        b["ignore_eos"] is True and "min_tokens" not in b and "stop_token_ids" not in b for b in bodies
    )
    assert all("logprobs" not in b and b["model"] == "tiny.gguf" for b in bodies)
    # the same token ids as the in-process rows' prompts
    lengths = [r["num_prompt_tokens"] for r in rows[("none", 1)]["requests"]]
    assert sorted(len(b["prompt"]) for b in bodies[:3]) == sorted(lengths)
    assert "llama-server" in capsys.readouterr().out


def test_without_ignore_eos_llama_server_stops_at_its_own_end_of_generation_tokens(
    tmp_path, fake_llama_server
):
    assert main(bench_on_a_gguf(tmp_path, "--baseline", "llama-server")) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert [r["finish_reason"] for r in rows["llama-server"]["requests"]] == ["stop"] * 3
    bodies = [e["body"] for e in fake_llama_server() if "body" in e]
    assert all("ignore_eos" not in b and "stop_token_ids" not in b for b in bodies)


def test_no_binary_is_refused_before_any_model_loads_saying_how_to_get_one(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(bench_on_a_gguf(tmp_path, "--baseline", "llama-server")) == 2
    assert "docs/benchmarking.md" in capsys.readouterr().err
    assert main(bench_on_a_gguf(tmp_path, "--llama-server-args", "--spec-type ngram-mod")) == 2
    assert "go with --baseline llama-server" in capsys.readouterr().err


def test_a_server_that_exits_at_start_fails_the_bench_with_its_log(tmp_path, capsys):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\necho 'error: unknown argument: --spec-type' >&2\nexit 1\n")
    binary.chmod(0o755)
    argv = bench_on_a_gguf(tmp_path, "--baseline", "llama-server", "--llama-server", str(binary))
    assert main([*argv, "--llama-server-args", "--spec-type nope"]) == 2
    err = capsys.readouterr().err
    assert "exited with code 1" in err and "unknown argument: --spec-type" in err


def test_a_llama_server_that_dies_fails_its_requests_from_then_on_and_the_bench_goes_on(
    tmp_path, fake_llama_server, monkeypatch, capsys, caplog
):
    monkeypatch.setenv("FAKE_LLAMA_SERVER_DIE_AT", "2")
    argv = bench_on_a_gguf(
        tmp_path, "--ignore-eos", "--concurrency", "1,2", "--baseline", "none,llama-server"
    )
    assert main(argv) == 0
    rows = {
        (r["name"], r["concurrency"]): r for r in json.loads((tmp_path / "r.json").read_text())["results"]
    }
    first = rows[("llama-server", 1)]["requests"]
    assert first[0]["num_output_tokens"] == 5 and first[0]["error"] is None
    assert all(r["error"] for r in first[1:])  # the one it died in, and those that found no server
    assert rows[("llama-server", 1)]["num_failed"] == 2
    assert rows[("llama-server", 2)]["num_failed"] == 3
    assert all(r["error"] is None for c in (1, 2) for r in rows[("none", c)]["requests"])
    assert "3 (2 failed)" in capsys.readouterr().out
    assert (
        "llama-server died at c=1; its requests from then on fail: llama-server exited with code 3"
        in caplog.text
    )


def test_conversations_go_to_llama_server_turn_by_turn_with_its_answers_in_the_next_prompt(
    tmp_path, fake_llama_server
):
    argv = bench_on_a_gguf(tmp_path, "--ignore-eos", "--concurrency", "2", "--baseline", "none,llama-server")
    argv[argv.index("--dataset") + 1] = write_conversations(tmp_path / "conversations.jsonl")
    argv[argv.index("--num-requests") + 1] = "2"
    assert main(argv) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    served = rows["llama-server"]["requests"]
    assert [(r["id"], r["turn"]) for r in served] == [(f"c{i}/turn{t}", t) for i in (0, 1) for t in (1, 2, 3)]
    assert all(r["num_output_tokens"] == 5 and r["error"] is None for r in served)
    assert rows["llama-server"]["ttft_later_turns_ms_p50"] is not None
    # each turn's prompt: the conversation so far, the server's answer ("xxxxx") and the next question in it
    bodies = {b["seed"]: b["prompt"] for b in (e["body"] for e in fake_llama_server() if "body" in e)}
    for i in (0, 1):
        lengths = [len(bodies[i * 1000 + t]) for t in (1, 2, 3)]
        assert (
            lengths[0]
            == served[3 * i]["num_prompt_tokens"]
            == rows["none"]["requests"][3 * i]["num_prompt_tokens"]
        )
        assert lengths[0] + 5 < lengths[1] and lengths[1] + 5 < lengths[2]
    starts = [e["argv"] for e in fake_llama_server() if "argv" in e]
    slot = int(starts[0][starts[0].index("-c") + 1]) // 2  # (its context, split among 2 slots)
    assert slot > max(len(p) for p in bodies.values()) + 5  # room for the last turn's prompt and answer
