"""The executor on a CUDA device: the invariants the CPU suite checks, run where the CUDA-only code runs
(pinned host masks, the mask worker's side stream and event, the CuPy mask kernel, device-side
verification). Marked ``gpu``; skipped where no CUDA device exists.

Each test compares against the same run on the CPU: float64 tiny models give the same greedy tokens on
both devices, so any difference is a bug of the CUDA path, not of rounding.
"""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest
import torch
from specexec import Executor, ExecutorConfig, FinishReason, Request, SamplingParams
from test_eagle3 import eagle_spec, make_head_dir
from tiny_models import make_prompts, make_tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MAX_TOKENS = 16
#: 8 prompts of mixed lengths, three repetitive so NGram drafts get accepted
PROMPTS = make_prompts(8, [1, 30, 5, 17, 2, 12, 9, 20], seed=3)
PROMPTS[1] = [5, 6, 7, 8] * 7 + [5, 6]
PROMPTS[3] = [9, 10, 11] * 5 + [9, 10]


def make_config(device: str, **overrides) -> ExecutorConfig:
    settings = dict(
        num_kv_blocks=128, block_size=4, max_num_tokens=128, max_batch_size=8, dtype="float64", device=device
    )
    settings.update(overrides)
    return ExecutorConfig(**settings)


def greedy_requests(prompts=PROMPTS) -> list[Request]:
    return [
        Request(p, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True), request_id=f"r{i}")
        for i, p in enumerate(prompts)
    ]


def assert_all_free(executor: Executor) -> None:
    bm = executor.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not bm.block_tables
    assert not executor.core.has_unfinished()
    draft_bm = getattr(executor.speculation.drafter, "block_manager", None)
    if draft_bm is not None:
        assert draft_bm.num_free_blocks == draft_bm.num_blocks


def cpu_reference(arch: str) -> list[list[int]]:
    _, model = make_tiny_model(arch)
    with Executor(model, make_config("cpu")) as executor:
        return [o.token_ids for o in executor.run(greedy_requests())]


def speculative_configs(tmp_path) -> dict[str, dict | None]:
    make_head_dir(tmp_path)
    return {
        "none": None,
        "ngram": {"decoding_type": "NGram", "max_draft_len": 4},
        "self-int8": {"decoding_type": "DraftTarget", "max_draft_len": 4},
        "eagle3": eagle_spec(tmp_path),
    }


@pytest.mark.parametrize("drafter", ["none", "ngram", "self-int8", "eagle3"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_greedy_output_on_cuda_equals_the_cpu_output_for_every_drafter(arch, drafter, tmp_path):
    spec = speculative_configs(tmp_path)[drafter]
    _, model = make_tiny_model(arch)
    with Executor(model, make_config("cuda", speculative_config=spec)) as executor:
        assert executor.core.runner.device.type == "cuda"
        outputs = executor.run(greedy_requests())
        assert [o.finish_reason for o in outputs] == [FinishReason.LENGTH] * len(outputs), [
            o.error for o in outputs
        ]
        assert [o.token_ids for o in outputs] == cpu_reference(arch)
        if drafter == "ngram":
            assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0
        assert_all_free(executor)


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "maximum": 9}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_guided_outputs_on_cuda_validate_and_equal_the_cpu_outputs(dtype):
    """float32 logits take the CuPy mask kernel where CuPy imports; float64 the torch path."""
    from test_grammar_support import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    _, model = make_tiny_model("llama", vocab_size=49152, dtype=getattr(torch, dtype))
    chat = [{"role": "user", "content": "JSON please."}]
    fmt = {"type": "json_schema", "json_schema": {"schema": SCHEMA}}
    requests = [
        Request(chat, SamplingParams(max_tokens=40, seed=s, temperature=t), response_format=fmt)
        for s, t in [(0, 0.0), (1, 0.8), (2, 1.0)]
    ]
    results = {}
    for device in ("cpu", "cuda"):
        config = make_config(device, dtype=dtype, block_size=8, guided_json_max_whitespace=0)
        with Executor(model, config, tokenizer=tokenizer) as executor:
            outputs = executor.run(requests)
            for out in outputs:
                assert out.error is None, out.error
                if out.finish_reason is FinishReason.STOP:
                    jsonschema.validate(json.loads(out.text), SCHEMA)
                    assert out.guided_valid is True
            assert_all_free(executor)
            results[device] = [o.token_ids for o in outputs]
    # greedy must agree; sampled rows draw from per-request generators on each device, so only greedy
    assert results["cuda"][0] == results["cpu"][0]


def test_nan_logits_on_cuda_fail_only_their_request():
    _, model = make_tiny_model("llama")
    with Executor(model, make_config("cuda")) as executor:
        runner = executor.core.runner
        forward = runner.forward

        def poisoned_forward(seqs):
            out = forward(seqs)
            with torch.inference_mode():
                for i, s in enumerate(seqs):
                    if s.block_table is executor.block_manager.block_tables.get("r0"):
                        out.logits[out.cu_logit_rows[i] : out.cu_logit_rows[i + 1]] = float("nan")
            return out

        runner.forward = poisoned_forward
        outputs = executor.run(greedy_requests())
        assert outputs[0].finish_reason is FinishReason.ERROR and "NaN" in outputs[0].error
        assert [o.token_ids for o in outputs[1:]] == cpu_reference("llama")[1:]
        assert_all_free(executor)
        runner.forward = forward
        assert [o.token_ids for o in executor.run(greedy_requests())] == cpu_reference("llama")


def test_two_threads_and_an_abort_on_cuda():
    _, model = make_tiny_model("llama")
    spec = {"decoding_type": "NGram", "max_draft_len": 3}
    expected = cpu_reference("llama")
    with Executor(model, make_config("cuda", speculative_config=spec)) as executor:
        results: dict[int, list] = {}

        def call(half: int) -> None:
            requests = greedy_requests()[half * 4 : half * 4 + 4]
            results[half] = [o.token_ids for o in executor.run(requests)]

        threads = [threading.Thread(target=call, args=(h,)) for h in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results[0] + results[1] == expected
        stream = executor.stream(greedy_requests())
        next(stream)
        executor.abort_request("r2")
        finished = {e.request_id: e.output for e in stream if e.finished}
        assert finished["r2"].finish_reason is FinishReason.ABORT
        assert finished["r5"].token_ids == expected[5]
        assert_all_free(executor)
