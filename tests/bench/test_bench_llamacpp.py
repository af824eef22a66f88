"""``--baseline llamacpp``: refused clearly without llama-cpp-python or a GGUF file; the engine drives
llama.cpp like the other engines (same token ids, greedy, the schema as a grammar), tested against a
stand-in for the binding; and, where llama-cpp-python is installed, once for real on the embedded GGUF."""

from __future__ import annotations

import json
import sys
import types

import pytest
from bench_inputs import bench_argv
from specexec.bench.engines.llamacpp import run_llamacpp
from specexec.bench.engines.specexec_hf import Workload
from specexec.cli import main
from specexec.prompt_sets.datasets import BenchPrompt

EOS = 0
EOT = 7  #: a second stop id, as Llama-3's <|eot_id|> is beside its EOS


class FakeTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        words = {1: "{", 2: "}", 3: "x"}
        return "".join(words.get(i, "") for i in ids if not (skip_special_tokens and i == EOS))


class FakeLlama:
    """Yields its script; records what each call asked for."""

    def __init__(self, script: list[int]) -> None:
        self.script, self.calls, self.resets, self.seeds = script, [], 0, []

    def token_eos(self) -> int:
        return EOS

    def set_seed(self, seed: int) -> None:
        self.seeds.append(seed)

    def reset(self) -> None:
        self.resets += 1

    def generate(self, tokens, **kwargs):
        self.calls.append((list(tokens), kwargs))
        for token in self.script:
            scores = [0.0] * 8
            for processor in kwargs.get("logits_processor") or []:
                scores = processor(tokens, scores)
            yield 3 if scores[token] == -float("inf") else token  # a forbidden token: the next best


def fake_binding(bad_schema: bool = False):
    grammars = []

    class LlamaGrammar:
        @staticmethod
        def from_json_schema(text, verbose=True):
            if bad_schema:
                raise ValueError("unsupported schema")
            grammars.append(text)
            return ("grammar", text)

    module = types.SimpleNamespace(LlamaGrammar=LlamaGrammar, LogitsProcessorList=list)
    return module, grammars


def two_prompt_workload(
    guided=False, ignore_eos=False, max_tokens=4, temperature=0.0, stops=(EOS, EOT)
) -> Workload:
    """Two prompts of token ids, the first with a schema (held to it when ``guided``)."""
    prompts = [BenchPrompt("a", [], {"type": "object"}), BenchPrompt("b", [], None)]
    ids = [[5, 6, 7], [8, 9]]
    return Workload(prompts, ids, max_tokens, temperature, ignore_eos, guided, stop_token_ids=list(stops))


def test_the_engine_passes_the_same_token_ids_greedy_and_stops_at_eos():
    binding, grammars = fake_binding()
    llm = FakeLlama([1, 2, EOS, 3])
    records, wall = run_llamacpp(binding, llm, FakeTokenizer(), two_prompt_workload())
    assert [call[0] for call in llm.calls] == [[5, 6, 7], [8, 9]]
    _, kwargs = llm.calls[0]
    assert kwargs["top_k"] == 1 and kwargs["temp"] == 0.0 and kwargs["repeat_penalty"] == 1.0
    assert kwargs["grammar"] is None and grammars == []  # not guided: no grammar
    assert llm.resets == 2, "each request starts from an empty cache"
    assert [r.num_output_tokens for r in records] == [3, 3]
    assert records[0].finish_reason == "stop" and records[0].text == "{}"
    assert records[0].schema_valid is True and records[1].schema_valid is None
    assert wall > 0 and records[0].ttft_ms is not None


def test_guided_requests_get_their_schema_as_a_grammar_and_a_bad_schema_fails_only_its_request():
    binding, grammars = fake_binding()
    llm = FakeLlama([1, 2, EOS])
    run_llamacpp(binding, llm, FakeTokenizer(), two_prompt_workload(guided=True))
    assert grammars == ['{"type": "object"}']
    assert llm.calls[0][1]["grammar"] == ("grammar", '{"type": "object"}')
    assert llm.calls[1][1]["grammar"] is None  # the prompt without a schema runs free
    bad, _ = fake_binding(bad_schema=True)
    records, _ = run_llamacpp(bad, FakeLlama([1, 2, EOS]), FakeTokenizer(), two_prompt_workload(guided=True))
    assert records[0].finish_reason == "error" and "unsupported schema" in records[0].error
    assert records[1].num_output_tokens == 3


def test_a_temperature_samples_the_whole_distribution_seeded_per_request_like_the_other_engines():
    binding, _ = fake_binding()
    llm = FakeLlama([1, 2, EOS])
    run_llamacpp(binding, llm, FakeTokenizer(), two_prompt_workload(temperature=0.7))
    _, kwargs = llm.calls[0]
    assert kwargs["temp"] == 0.7 and kwargs["top_k"] == 0 and kwargs["top_p"] == 1.0
    assert kwargs["min_p"] == 0.0 and kwargs["repeat_penalty"] == 1.0
    assert llm.seeds == [0, 1], "request i gets seed i, as in Workload.sampling_params"


def test_ignore_eos_forbids_the_eos_token_and_runs_to_max_tokens():
    binding, _ = fake_binding()
    records, _ = run_llamacpp(
        binding, FakeLlama([1, EOS, EOS, 2, 3]), FakeTokenizer(), two_prompt_workload(ignore_eos=True)
    )
    assert [r.num_output_tokens for r in records] == [4, 4]
    assert all(r.finish_reason == "length" for r in records)
    assert [r.num_stop_tokens for r in records] == [0, 0]


def test_ignore_eos_forbids_every_token_of_the_stop_set_not_only_token_eos():
    binding, _ = fake_binding()
    llm = FakeLlama([1, EOT, 2, EOT, 3])
    records, _ = run_llamacpp(binding, llm, FakeTokenizer(), two_prompt_workload(ignore_eos=True))
    assert [r.num_output_tokens for r in records] == [4, 4]
    assert [r.num_stop_tokens for r in records] == [0, 0], "the end-of-turn id is forbidden too"


def test_without_ignore_eos_any_token_of_the_stop_set_ends_a_request():
    binding, _ = fake_binding()
    records, _ = run_llamacpp(binding, FakeLlama([1, EOT, 2, 3]), FakeTokenizer(), two_prompt_workload())
    assert [r.num_output_tokens for r in records] == [2, 2]
    assert all(r.finish_reason == "stop" and r.num_stop_tokens == 1 for r in records)


def test_a_stop_set_without_the_ggufs_own_eos_is_refused():
    binding, _ = fake_binding()
    with pytest.raises(ValueError, match="EOS id 0 is not in the bench's stop set"):
        run_llamacpp(binding, FakeLlama([1, 2]), FakeTokenizer(), two_prompt_workload(stops=(EOT,)))


def test_without_llama_cpp_python_the_baseline_is_refused_with_the_install_command(
    tiny_dir,
    tmp_path,
    monkeypatch,
    capsys,
):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    assert main(bench_argv(tiny_dir, tmp_path, "--baseline", "llamacpp")) == 2
    assert "pip install llama-cpp-python" in capsys.readouterr().err


def test_a_binding_without_its_shared_library_is_refused_with_the_install_command(
    tiny_dir,
    tmp_path,
    monkeypatch,
    capsys,
):
    import builtins

    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "llama_cpp":
            raise FileNotFoundError("Shared library with base name 'llama' not found")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    monkeypatch.setattr(builtins, "__import__", broken)
    assert main(bench_argv(tiny_dir, tmp_path, "--baseline", "llamacpp")) == 2
    assert "pip install llama-cpp-python" in capsys.readouterr().err


def test_a_hugging_face_directory_is_refused_for_llamacpp(tiny_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))
    assert main(bench_argv(tiny_dir, tmp_path, "--baseline", "llamacpp")) == 2
    assert "Hugging Face directory" in capsys.readouterr().err


@pytest.mark.slow
def test_llama_cpp_runs_the_embedded_gguf_greedy_and_guided(tmp_path, capsys):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is an optional tool, not a dependency")
    argv = [
        "bench",
        "--baseline",
        "llamacpp",
        "--dataset",
        "extraction",
        "--num-requests",
        "1",
        "--max-tokens",
        "48",
        "--guided",
        "--warmup",
        "0",
        "--output",
        str(tmp_path / "r.json"),
    ]
    assert main(argv) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    request = rows["llamacpp"]["requests"][0]
    assert request["num_output_tokens"] > 0 and request["error"] is None
    assert request["text"].lstrip().startswith("{"), "the schema's grammar constrains the output"
    if request["finish_reason"] == "stop":  # finished within the tokens: it must validate
        assert request["schema_valid"] is True
