"""The executor on a CUDA device: the invariants the CPU suite checks, run where the CUDA-only code runs
(CUDA graph capture and replay, pinned host masks, the mask worker's side stream and event, the CuPy mask
kernel, device-side verification). Marked ``gpu``; skipped where no CUDA device exists.

float64 tiny models give the same greedy tokens on both devices, so a run on CUDA (graphs on, the
default) is compared with the CPU's. In float32 and bfloat16 a graph replay is compared with the eager
launch of the very same padded shapes (the eager-replay backend): same kernels on the same shapes, so any
difference is a bug of the graphs, not of rounding.
"""

from __future__ import annotations

import json
import linecache
import threading
import warnings

import jsonschema
import pytest
import torch
from capture_checks import graph_stats
from eagle3_heads import eagle_spec, make_head_dir
from factories import assert_all_pages_free, greedy_requests, tiny_config
from specexec import Executor, FinishReason, Request, SamplingParams
from specexec.executor.engine_setup import capture_cuda_graphs
from specexec.executor.model.cuda_graphs import CudaGraphCapture, EagerReplay
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


def cpu_reference(arch: str) -> list[list[int]]:
    _, model = make_tiny_model(arch)
    with Executor(model, tiny_config(device="cpu")) as executor:
        return [o.token_ids for o in executor.run(greedy_requests(PROMPTS, MAX_TOKENS))]


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
    with Executor(model, tiny_config(device="cuda", speculative_config=spec)) as executor:
        assert executor.core.runner.device.type == "cuda"
        outputs = executor.run(greedy_requests(PROMPTS, MAX_TOKENS))
        assert [o.finish_reason for o in outputs] == [FinishReason.LENGTH] * len(outputs), [
            o.error for o in outputs
        ]
        assert [o.token_ids for o in outputs] == cpu_reference(arch)
        if drafter == "ngram":
            assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0
        assert executor.setup.cuda_graphs and all(r.error is None for r in executor.setup.cuda_graphs)
        assert all(s.num_replays > 0 for s in graph_stats(executor))
        assert_all_pages_free(executor)


def graphs_and_eager_replay(make_model, requests, tokenizer=None, **config) -> dict[str, list]:
    """The same requests with CUDA graphs, and with the same shapes launched eagerly (eager replay)."""
    tokens = {}
    for mode in ("graphs", "eager-replay"):
        with Executor(
            make_model(),
            tiny_config(device="cuda", cuda_graphs=mode == "graphs", **config),
            tokenizer=tokenizer,
        ) as executor:
            core = executor.core
            if mode == "eager-replay":
                drafter = executor.speculation.drafter
                executor.setup.cuda_graphs = capture_cuda_graphs(
                    executor.config, core.runner, drafter, core.max_model_len, EagerReplay()
                )
            reports = executor.setup.cuda_graphs
            assert reports and all(r.error is None for r in reports), [r.describe() for r in reports]
            outputs = executor.run(requests)
            for out in outputs:
                assert out.error is None, out.error
                if requests[0].response_format is not None and out.finish_reason is FinishReason.STOP:
                    jsonschema.validate(json.loads(out.text), SCHEMA)
                    assert out.guided_valid is True
            stats = graph_stats(executor)
            assert stats and all(s.num_replays > 0 for s in stats)
            assert executor.speculation.stats.num_drafter_errors == 0
            assert_all_pages_free(executor)
            tokens[mode] = [o.token_ids for o in outputs]
    return tokens


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3"])
def test_the_own_decoder_on_cuda_gives_the_tokens_of_transformers_modules(arch):
    """float64 on CUDA with NGram drafts: the own decoder (fused layers, its own RoPE and norms),
    replayed from graphs, gives the greedy tokens of transformers' modules behind the paged-attention
    hook, launched eagerly (cuBLAS refuses to capture transformers' float64 Qwen2 projections with a
    bias: "CUBLAS_STATUS_EXECUTION_FAILED", H100, torch 2.11)."""
    spec = {"decoding_type": "NGram", "max_draft_len": 4}
    outputs = {}
    for impl, graphs in (("transformers", False), ("specexec", True)):
        _, model = make_tiny_model(arch)
        config = tiny_config(device="cuda", model_impl=impl, speculative_config=spec, cuda_graphs=graphs)
        with Executor(model, config) as executor:
            assert executor.setup.model_impl.impl == impl
            outputs[impl] = [o.token_ids for o in executor.run(greedy_requests(PROMPTS, MAX_TOKENS))]
            if graphs:
                assert [r.error for r in executor.setup.cuda_graphs] == [None] * len(
                    executor.setup.cuda_graphs
                )
                assert executor.core.runner.graphs.stats.num_replays > 0
            assert_all_pages_free(executor)
    assert outputs["specexec"] == outputs["transformers"]


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma2", "gemma3"])
def test_the_triton_kernels_give_the_tokens_and_logprobs_of_torch_ops(arch, monkeypatch):
    """float32, the own decoder on CUDA with graphs and NGram drafts (decode and verify rows): with its
    Triton kernels (fused norms, RoPE + cache write, act * up, attention over the pages) and with torch
    ops (``SPECEXEC_CUDA_KERNELS=0``), the same greedy tokens and their log-probabilities to float32
    rounding."""
    from specexec.executor.layers import triton_kernels

    spec = {"decoding_type": "NGram", "max_draft_len": 4}
    results = {}
    for kernels in ("triton", "torch"):
        if kernels == "torch":
            monkeypatch.setenv(triton_kernels.SWITCH, "0")
        triton_kernels.triton_available.cache_clear()
        try:
            _, model = make_tiny_model(arch, dtype=torch.float32)
            config = tiny_config(device="cuda", dtype="float32", speculative_config=spec)
            with Executor(model, config) as executor:
                assert executor.setup.model_impl.impl == "specexec"
                requests = [
                    Request(
                        p,
                        SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0),
                        request_id=f"r{i}",
                    )
                    for i, p in enumerate(PROMPTS)
                ]
                outputs = executor.run(requests)
                assert executor.core.runner.graphs.stats.num_replays > 0
                assert_all_pages_free(executor)
        finally:
            monkeypatch.delenv(triton_kernels.SWITCH, raising=False)
            triton_kernels.triton_available.cache_clear()
        results[kernels] = outputs
    for fast, reference in zip(results["triton"], results["torch"]):
        assert fast.error is None and fast.token_ids == reference.token_ids
        torch.testing.assert_close(
            torch.tensor([e.logprob for e in fast.logprobs]),
            torch.tensor([e.logprob for e in reference.logprobs]),
            rtol=1e-4,
            atol=1e-4,
        )


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("drafter", ["none", "ngram", "self-int8", "eagle3"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replay_gives_the_tokens_of_eager_launches_for_every_drafter(dtype, drafter, batch, tmp_path):
    spec = speculative_configs(tmp_path)[drafter]
    tokens = graphs_and_eager_replay(
        lambda: make_tiny_model("llama", dtype=getattr(torch, dtype))[1],
        greedy_requests(PROMPTS[:batch], MAX_TOKENS),
        dtype=dtype,
        speculative_config=spec,
    )
    assert tokens["graphs"] == tokens["eager-replay"]


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "maximum": 9}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_guided_outputs_on_cuda_validate_and_equal_the_cpu_outputs(dtype):
    """float32 logits take the CuPy mask kernel where CuPy imports; float64 the torch path."""
    from grammar_support import smollm2_tokenizer

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
        config = tiny_config(device=device, dtype=dtype, block_size=8, guided_json_max_whitespace=0)
        with Executor(model, config, tokenizer=tokenizer) as executor:
            outputs = executor.run(requests)
            for out in outputs:
                assert out.error is None, out.error
                if out.finish_reason is FinishReason.STOP:
                    jsonschema.validate(json.loads(out.text), SCHEMA)
                    assert out.guided_valid is True
            assert_all_pages_free(executor)
            results[device] = [o.token_ids for o in outputs]
    # greedy must agree; sampled rows draw from per-request generators on each device, so only greedy
    assert results["cuda"][0] == results["cpu"][0]


def json_requests(n: int) -> list[Request]:
    chat = [{"role": "user", "content": "JSON please."}]
    fmt = {"type": "json_schema", "json_schema": {"schema": SCHEMA}}
    return [Request(chat, SamplingParams(max_tokens=40), response_format=fmt) for _ in range(n)]


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("drafter", ["none", "ngram", "self-int8"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_guided_graph_replay_gives_the_tokens_of_eager_launches(dtype, drafter, batch, tmp_path):
    """Grammar masks (CuPy kernel, mask event) after graph replays, forced runs up to 16 tokens, and
    the draft model's own masks on the device."""
    from grammar_support import smollm2_tokenizer

    spec = speculative_configs(tmp_path)[drafter]
    tokens = graphs_and_eager_replay(
        lambda: make_tiny_model("llama", vocab_size=49152, dtype=getattr(torch, dtype))[1],
        json_requests(batch),
        tokenizer=smollm2_tokenizer(),
        dtype=dtype,
        block_size=8,
        guided_json_max_whitespace=0,
        speculative_config=spec,
    )
    assert tokens["graphs"] == tokens["eager-replay"]


def test_guided_draft_target_drafts_on_cuda():
    """Draft-side grammar masks reach CUDA draft logits (a CPU bitmask used to make every guided
    drafting call raise, and guided requests silently got no drafts)."""
    from grammar_support import smollm2_tokenizer

    _, model = make_tiny_model("llama", vocab_size=49152, dtype=torch.float32)
    spec = {"decoding_type": "DraftTarget", "max_draft_len": 3}
    config = tiny_config(
        device="cuda", dtype="float32", block_size=8, guided_json_max_whitespace=0, speculative_config=spec
    )
    with Executor(model, config, tokenizer=smollm2_tokenizer()) as executor:
        outputs = executor.run(json_requests(2))
        assert executor.speculation.stats.num_drafter_errors == 0
        drafted = sum(o.metrics.num_draft_tokens - o.metrics.num_forced_tokens for o in outputs)
        assert drafted > 0, "the draft model proposed nothing for guided requests"
        masks = executor.speculation.drafter._masks
        assert masks._host_bitmask.is_pinned() and masks._bitmask.device.type == "cuda"


def test_a_failed_capture_leaves_the_stream_and_random_draws_as_they_were():
    device = torch.device("cuda")
    backend = CudaGraphCapture(device)
    before = torch.cuda.current_stream(device)
    values = torch.ones(4, device=device)

    def host_read():  # a read on the host during the capture invalidates it
        return {"sum": values.sum() * float(values.sum().item())}, {}

    with pytest.raises(RuntimeError):  # torch.AcceleratorError is one
        backend.capture(host_read)
    assert torch.cuda.current_stream(device) == before
    torch.rand(8, device=device)  # raised "Offset increment outside graph capture" before the recovery
    replay = backend.capture(lambda: ({"twice": values * 2}, {}))  # and later captures still work
    assert torch.equal(replay()[0]["twice"], torch.full((4,), 2.0, device=device))


def test_no_host_sync_between_the_replay_and_the_steps_one_read_back():
    """From the forward's end to the verified tokens, a step waits for the device once: the transfer of
    its answers (sync debug mode counts every synchronizing call)."""
    from grammar_support import smollm2_tokenizer

    _, model = make_tiny_model("llama", vocab_size=49152, dtype=torch.float32)
    spec = {"decoding_type": "NGram", "max_draft_len": 3}
    config = tiny_config(
        device="cuda", dtype="float32", block_size=8, guided_json_max_whitespace=0, speculative_config=spec
    )
    requests = json_requests(2) + [
        Request([5, 6, 7, 8] * 6, SamplingParams(max_tokens=20, temperature=0.8, top_p=0.9, seed=1)),
        Request([9, 10, 11] * 6, SamplingParams(max_tokens=20, ignore_eos=True)),
    ]
    with Executor(model, config, tokenizer=smollm2_tokenizer()) as executor:
        core = executor.core
        syncs_per_step: list[list[str]] = []  # per step: where each synchronizing call was made
        stages = {name: getattr(core, name) for name in ("_wait_for_masks", "_apply_masks", "_sample")}
        counted: list[str] = []

        elsewhere: list[str] = []  # synchronizing calls of other threads meanwhile (the mask worker's)

        def record(message, category, filename, lineno, file=None, line=None):
            if "called a synchronizing CUDA operation" in str(message):  # (not the mode's one-time notice)
                where = f"{filename}:{lineno} ({linecache.getline(filename, lineno).strip()})"
                on_main = threading.current_thread() is threading.main_thread()
                (counted if on_main else elsewhere).append(where)

        def counting(name):
            def run(*args, **kwargs):
                # sync debug mode and the warnings filters are process-wide: ``record`` tells the step's
                # own thread from the mask worker's, whose syncs hold up only the worker
                with warnings.catch_warnings():
                    warnings.simplefilter("always")
                    warnings.showwarning = record
                    torch.cuda.set_sync_debug_mode("warn")
                    before = len(counted)
                    try:
                        return stages[name](*args, **kwargs)
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
                        counted[before:] = [f"{name}: {where}" for where in counted[before:]]
                        if name == "_sample":
                            syncs_per_step.append(list(counted))
                            counted.clear()

            return run

        for name in stages:
            setattr(core, name, counting(name))
        outputs = executor.run(requests)
        assert all(o.error is None for o in outputs)
        assert core.runner.graphs.stats.num_replays > 0
        extra = [(step, where) for step, where in enumerate(syncs_per_step) if len(where) > 1]
        assert not extra, (extra, elsewhere)  # (step, the calls that synchronized) where more than one
        assert syncs_per_step and max(map(len, syncs_per_step)) == 1, syncs_per_step


def test_the_mask_event_orders_the_copy_before_the_kernel():
    """The worker's host-to-device copy is held back on its side stream; the kernel queued right after
    wait() must still see this step's mask, not the previous one."""
    from specexec.grammar.mask_worker import MaskJob, MaskWorker
    from specexec.grammar.request_grammar import RowFill
    from specexec.kernels import apply_mask_inplace

    vocab = 4096

    class Pattern:  # allows t % modulus == 0 on its one row
        def __init__(self, modulus):
            self.modulus = modulus

        def fill_rows(self, bitmask, row0, drafts):
            allowed = torch.zeros(bitmask.shape[1] * 32, dtype=torch.bool)
            allowed[:: self.modulus] = True
            bits = allowed.view(-1, 32).long() << torch.arange(32)
            bitmask[row0] = bits.sum(dim=1).to(torch.int32)
            return RowFill(1, 0, None, False)

    worker = MaskWorker(4, vocab, "cuda")
    build = worker._build

    def held_back_build(jobs, n):
        with torch.cuda.stream(worker._stream):
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the copy is queued behind it
        return build(jobs, n)

    try:
        for step, modulus in enumerate((2, 3)):
            if step == 1:
                worker._build = held_back_build
            worker.start([MaskJob(Pattern(modulus), 0, ())], 1)
            result = worker.wait()
            logits = torch.zeros(1, vocab, device="cuda")
            apply_mask_inplace(logits, result.bitmask, result.needs_mask)
            allowed = torch.isfinite(logits[0]).cpu()
            assert torch.equal(allowed, torch.arange(vocab) % modulus == 0), f"step {step} saw a stale mask"
    finally:
        worker.close()


def test_nan_logits_on_cuda_fail_only_their_request():
    _, model = make_tiny_model("llama")
    with Executor(model, tiny_config(device="cuda")) as executor:
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
        outputs = executor.run(greedy_requests(PROMPTS, MAX_TOKENS))
        assert outputs[0].finish_reason is FinishReason.ERROR and "NaN" in outputs[0].error
        assert [o.token_ids for o in outputs[1:]] == cpu_reference("llama")[1:]
        assert_all_pages_free(executor)
        runner.forward = forward
        assert [o.token_ids for o in executor.run(greedy_requests(PROMPTS, MAX_TOKENS))] == cpu_reference(
            "llama"
        )


def test_two_threads_and_an_abort_on_cuda():
    _, model = make_tiny_model("llama")
    spec = {"decoding_type": "NGram", "max_draft_len": 3}
    expected = cpu_reference("llama")
    with Executor(model, tiny_config(device="cuda", speculative_config=spec)) as executor:
        results: dict[int, list] = {}

        def call(half: int) -> None:
            requests = greedy_requests(PROMPTS, MAX_TOKENS)[half * 4 : half * 4 + 4]
            results[half] = [o.token_ids for o in executor.run(requests)]

        threads = [threading.Thread(target=call, args=(h,)) for h in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results[0] + results[1] == expected
        stream = executor.stream(greedy_requests(PROMPTS, MAX_TOKENS))
        next(stream)
        executor.abort_request("r2")
        finished = {e.request_id: e.output for e in stream if e.finished}
        assert finished["r2"].finish_reason is FinishReason.ABORT
        assert finished["r5"].token_ids == expected[5]
        assert_all_pages_free(executor)
