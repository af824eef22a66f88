"""`specexec bench`'s one stop set and one ``--ignore-eos``: every engine stops on the same tokens, and
with ``--ignore-eos`` none of them can be sampled in any engine (the rows count the stop tokens they
sampled). The tiny model here has two stop ids that differ, as Llama-3's EOS and ``<|eot_id|>`` do, and
greedy decoding picks the generation config's one within a request's first tokens."""

from __future__ import annotations

import json
import types

import pytest
from bench_inputs import CONFIG_EOS, TOKENIZER_EOS, save_tiny_dir_with_two_stop_ids, write_dataset
from specexec.bench.engines.server import Outgoing, request_body
from specexec.bench.engines.specexec_hf import Workload
from specexec.bench.report import COLUMNS
from specexec.bench.workload.stop_tokens import find_stop_tokens, num_stop_tokens
from specexec.cli import main
from specexec.prompt_sets.datasets import BenchPrompt

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def stop_dir(tmp_path_factory):
    return save_tiny_dir_with_two_stop_ids(tmp_path_factory.mktemp("stops"))


def run_bench(stop_dir, tmp_path, *extra: str) -> dict:
    argv = ["bench", "--model", stop_dir, "--dataset", write_dataset(tmp_path / "prompts.jsonl")]
    argv += ["--num-requests", "3", "--max-tokens", str(MAX_TOKENS), "--decoding-type", "NGram"]
    argv += ["--concurrency", "1,2", "--baseline", "none,hf", "--hf-prompt-lookup-tokens", "3"]
    argv += ["--output", str(tmp_path / "r.json"), *extra]
    assert main(argv) == 0
    return json.loads((tmp_path / "r.json").read_text())


ENGINE_ROWS = {
    ("none", 1),
    ("none", 2),
    ("ngram-k3", 1),
    ("ngram-k3", 2),
    ("hf", 1),
    ("hf-prompt-lookup-3", 1),
    ("hf-assisted", 1),
    ("hf-batch", 2),
}


@pytest.fixture(scope="module")
def stopping_run(stop_dir, tmp_path_factory):
    return run_bench(stop_dir, tmp_path_factory.mktemp("stopping"))


@pytest.fixture(scope="module")
def ignore_eos_run(stop_dir, tmp_path_factory):
    return run_bench(stop_dir, tmp_path_factory.mktemp("ignoring"), "--ignore-eos")


def test_the_record_names_the_one_stop_set_and_where_each_id_came_from(stopping_run):
    assert stopping_run["stop_token_ids"] == [CONFIG_EOS, TOKENIZER_EOS]
    sources = stopping_run["stop_token_sources"]
    assert sources == {"tokenizer": [TOKENIZER_EOS], "generation_config": [CONFIG_EOS]}
    assert stopping_run["ignore_eos"] is False and stopping_run["ignore_eos_meaning"] is None


def test_every_engine_stops_on_the_generation_configs_stop_id_too(stopping_run):
    rows = {(r["name"], r["concurrency"]): r for r in stopping_run["results"]}
    assert set(rows) == ENGINE_ROWS
    lengths = [r["num_output_tokens"] for r in rows[("none", 1)]["requests"]]
    assert all(n < MAX_TOKENS for n in lengths), "the premise: each request meets a stop token early"
    for key, row in rows.items():
        requests = row["requests"]
        assert [r["finish_reason"] for r in requests] == ["stop"] * 3, key
        assert [r["num_stop_tokens"] for r in requests] == [1, 1, 1], key
        assert [r["num_output_tokens"] for r in requests] == lengths, key


def test_ignore_eos_lets_no_engine_sample_a_stop_token(ignore_eos_run):
    rows = {(r["name"], r["concurrency"]): r for r in ignore_eos_run["results"]}
    assert set(rows) == ENGINE_ROWS
    assert ignore_eos_run["ignore_eos"] is True
    assert ignore_eos_run["ignore_eos_meaning"].startswith("no token of the stop set can be sampled")
    for key, row in rows.items():
        assert row["num_stop_tokens"] == 0, key
        assert [r["num_output_tokens"] for r in row["requests"]] == [MAX_TOKENS] * 3, key
        assert row["stop_tokens_forbidden_by"], key


def test_ttft_at_c2_starts_when_a_request_is_sent_in_every_engine(ignore_eos_run):
    """Three requests, two slots: the third is sent when one of the first two finishes. Were its clock
    started with the others' (generate_batch's queue), its TTFT would hold the first one's whole run."""
    for row in ignore_eos_run["results"]:
        if row["concurrency"] != 2:
            continue
        ttfts = [r["ttft_ms"] for r in row["requests"]]
        latencies = [r["latency_ms"] for r in row["requests"]]
        assert max(ttfts) < min(latencies), (row["name"], ttfts, latencies)


def test_the_table_shows_the_stop_tokens_each_row_sampled(stop_dir, tmp_path, capsys):
    run_bench(stop_dir, tmp_path, "--ignore-eos", "--baseline", "none", "--concurrency", "1")
    lines = capsys.readouterr().out.splitlines()
    columns = [c for c in COLUMNS if c != "ttft 2+ ms"]  # (conversations only)
    assert "stops" in lines[0].split()
    none = next(line for line in lines if line.startswith("none ")).split()
    assert none[columns.index("stops")] == "0"
    assert "stop tokens [4, 5] for every engine: cannot be sampled (--ignore-eos)" in lines


def test_the_stop_set_is_the_union_of_the_tokenizers_the_generation_configs_and_the_ggufs():
    from specexec.executor.model.model_loader import default_model_path

    tokenizer = types.SimpleNamespace(eos_token_id=2)
    config = types.SimpleNamespace(eos_token_id=[2, 9])
    stops = find_stop_tokens(tokenizer, config, default_model_path())
    assert stops.sources == {"tokenizer": [2], "generation_config": [2, 9], "gguf": [2]}
    assert stops.token_ids == [2, 9]
    assert find_stop_tokens(tokenizer, types.SimpleNamespace(eos_token_id=None)).token_ids == [2]
    assert num_stop_tokens([2, 3, 9, 2], stops.token_ids) == 3


def stop_set_workload(ignore_eos: bool) -> Workload:
    """One prompt whose stop set is both stop ids, EOS ignored or not."""
    prompts = [BenchPrompt("a", [], None)]
    return Workload(prompts, [[7, 8]], 4, 0.0, ignore_eos, stop_token_ids=[CONFIG_EOS, TOKENIZER_EOS])


def test_specexec_gets_the_stop_set_as_stop_tokens_banned_until_max_tokens_with_ignore_eos():
    stopping = stop_set_workload(False).sampling_params(0)
    assert stopping.stop_token_ids == [CONFIG_EOS, TOKENIZER_EOS] and stopping.min_tokens == 0
    ignoring = stop_set_workload(True).sampling_params(0)
    assert ignoring.stop_token_ids == [CONFIG_EOS, TOKENIZER_EOS] and not ignoring.ignore_eos
    assert ignoring.min_tokens == ignoring.max_tokens == 4 and not ignoring.logit_bias
    ignoring.validate()


def test_a_server_gets_the_stop_set_as_stop_token_ids_banned_until_max_tokens_with_ignore_eos():
    def first(work: Workload) -> Outgoing:
        return Outgoing(work.prompts[0], work.token_ids[0], seed=0)

    stopping_work, ignoring_work = stop_set_workload(False), stop_set_workload(True)
    stopping = request_body(stopping_work, first(stopping_work))
    assert stopping["stop_token_ids"] == [CONFIG_EOS, TOKENIZER_EOS] and "min_tokens" not in stopping
    ignoring = request_body(ignoring_work, first(ignoring_work))
    assert ignoring["stop_token_ids"] == [CONFIG_EOS, TOKENIZER_EOS] and ignoring["min_tokens"] == 4
    assert "logit_bias" not in ignoring and "ignore_eos" not in ignoring
    assert ignoring["logprobs"] == 0, "each chunk names its tokens, so the stop tokens can be counted"
