"""Tensor parallelism on CPU (gloo): the target sharded over worker processes gives the single-process
tokens (float64 tiny models: Llama, Qwen2 with q/k/v biases, Gemma2's sandwich norms and soft caps),
without drafts, with NGram, with the draft model and guided; samples at temperature 1 follow the
target's distribution; KV-head groups split unevenly give the same tokens; a size above the KV heads
is refused naming them; a killed worker fails the requests in flight naming its rank, the ranks start
again, and no worker outlives the executor."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from factories import assert_all_pages_free, drafting_config
from specexec import Executor, Request, SamplingParams
from specexec.executor.model.forward_io import SequenceInput
from specexec.executor.parallel.tp_runner import TensorParallelError
from speculative_runs import SELF_DRAFT_SPEC
from tensor_parallel_runs import INT4_SHAPES, PROMPTS, UNEVEN, generate, no_workers_left
from tiny_models import make_tiny_model

NGRAM = {"decoding_type": "NGram", "max_draft_len": 3}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2", "gemma3"])
def test_two_ranks_give_the_single_process_tokens(arch):
    assert generate(arch, 2) == generate(arch, 1)


def test_prefix_caching_under_two_ranks_reuses_pages_and_keeps_the_tokens():
    """The front's block manager shares pages by number; every rank's cache holds its heads of them."""
    shared = PROMPTS[3] + [9, 8, 7]
    tokens = {}
    for tp in (1, 2):
        _, model = make_tiny_model("llama")
        config = drafting_config(tensor_parallel_size=tp, enable_prefix_caching=True, max_num_tokens=32)
        with Executor(model, config) as executor:
            first = executor.run([Request(PROMPTS[3], SamplingParams(max_tokens=6, ignore_eos=True))])
            second = executor.run([Request(shared, SamplingParams(max_tokens=6, ignore_eos=True))])
            assert second[0].metrics.num_cached_tokens >= 36
            assert_all_pages_free(executor)
            tokens[tp] = [first[0].token_ids, second[0].token_ids]
    assert tokens[2] == tokens[1]


@pytest.mark.parametrize("drafter", ["ngram", "self-draft"])
def test_drafters_in_the_front_give_the_same_tokens_under_two_ranks(drafter):
    spec = {"ngram": NGRAM, "self-draft": SELF_DRAFT_SPEC}[drafter]
    assert generate("llama", 2, spec) == generate("llama", 1, spec)


def test_guided_requests_under_two_ranks_equal_one():
    from guided_runs import guided_executor, person_requests

    texts = {}
    for tp in (1, 2):
        with guided_executor(NGRAM, tensor_parallel_size=tp, device="cpu") as executor:
            outputs = executor.run(person_requests(3, max_tokens=40))
            assert all(o.error is None for o in outputs)
            texts[tp] = [o.text for o in outputs]
    assert texts[2] == texts[1]


def test_samples_at_temperature_one_follow_the_targets_distribution_under_two_ranks():
    from collections import Counter

    import sampled_distribution as distribution

    _, model = distribution.make_target()
    spec = {"decoding_type": "NGram", "max_draft_len": 2}
    config = distribution.sampling_config(speculative_config=spec, tensor_parallel_size=2)
    with Executor(model, config) as executor:
        params = [
            SamplingParams(max_tokens=distribution.MAX_TOKENS, temperature=1.0, seed=i)
            for i in range(distribution.NUM_SAMPLES)
        ]
        outputs = executor.run([Request(distribution.PROMPT, p) for p in params])
        assert executor.speculation.stats.num_draft_tokens > 0
    counts = Counter(tuple(o.token_ids) for o in outputs)
    target = distribution.adjusted_distribution(lambda row, seen, out: row)
    p_value, cells = distribution.chi_square_p_value(counts, target)
    assert cells > 10 and p_value > 1e-3, (p_value, cells)


def test_a_size_above_the_kv_heads_is_refused_naming_them():
    _, model = make_tiny_model("llama")  # 4 heads, 2 KV heads
    with pytest.raises(
        ValueError, match="cannot split this model .4 attention heads, 2 KV heads, 64 intermediate"
    ):
        Executor(model, drafting_config(tensor_parallel_size=3))


def test_kv_head_groups_split_unevenly_give_the_single_process_tokens():
    """(Qwen2: q/k/v biases cut with their rows.)"""
    from specexec.executor.parallel.sharding import kv_heads_of

    assert [kv_heads_of(r, 2, 3) for r in (0, 1)] == [(0, 2), (2, 3)]
    assert [kv_heads_of(r, 3, 8) for r in (0, 1, 2)] == [(0, 3), (3, 6), (6, 8)]
    one, two = (generate("qwen2", tp, NGRAM, model_overrides=UNEVEN) for tp in (1, 2))
    assert two == one


def test_options_not_built_under_tensor_parallelism_are_refused_before_loading():
    with pytest.raises(ValueError, match="runs on CPU .gloo. only"):
        Executor(None, drafting_config(tensor_parallel_size=2, device="cuda"))
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        drafting_config(tensor_parallel_size=0)


@pytest.mark.parametrize(("quantization", "shapes"), [("int8", {}), ("int4", INT4_SHAPES)])
def test_quantized_shards_give_the_single_process_tokens(quantization, shapes):
    """Each rank holds its slices of the codes as stored (float64: the dequantized values, exactly)."""
    one, two = (generate("llama", tp, model_overrides=shapes, quantization=quantization) for tp in (1, 2))
    assert two == one


def test_a_quantized_models_shard_keeps_its_layers_quantized():
    from specexec.executor.layers.quantized.quantization import quantize_model
    from specexec.executor.layers.quantized.quantized_linear import Int4WeightOnlyLinear, Int8WeightOnlyLinear
    from specexec.executor.model.decoder.convert import convert_to_own_decoder
    from specexec.executor.parallel.sharding import shard_model

    _, model = make_tiny_model("llama", **INT4_SHAPES)
    convert_to_own_decoder(model)
    quantize_model(model, "int4")
    shard = shard_model(model, 1, 2, comm=None)
    layer = shard.model.layers[0]
    assert isinstance(layer.qkv_proj, Int4WeightOnlyLinear) and layer.qkv_proj.out_features == 128
    assert isinstance(layer.o_proj.local, Int4WeightOnlyLinear) and layer.o_proj.local.in_features == 64
    assert isinstance(layer.down_proj.local, Int4WeightOnlyLinear) and layer.down_proj.local.bias is None
    assert isinstance(shard.lm_head.local, Int8WeightOnlyLinear) and shard.lm_head.local.out_features == 128
    assert isinstance(model.model.layers[0].o_proj, Int4WeightOnlyLinear), "the front's model is untouched"


def test_an_embedding_looked_up_in_the_tied_heads_codes_keeps_the_whole_table_in_each_shard(cpu_ops_built):
    """A GGUF's embedding read from its tied head's int8 blocks (`quantized_embedding.py`): each rank's
    head is its rows, yet its embedding still holds every row of the codes."""
    from specexec.executor.layers.quantized.q8_block_linear import Int8BlockLinear
    from specexec.executor.layers.quantized.quantized_embedding import QuantizedEmbedding
    from specexec.executor.model.decoder.convert import convert_to_own_decoder
    from specexec.executor.parallel.sharding import shard_model

    _, model = make_tiny_model("llama", **INT4_SHAPES)
    convert_to_own_decoder(model)
    vocab, hidden = model.lm_head.out_features, model.lm_head.in_features
    codes = torch.randint(
        -127, 128, (vocab, hidden), dtype=torch.int8, generator=torch.Generator().manual_seed(0)
    )
    model.lm_head = Int8BlockLinear(model.lm_head, codes, torch.rand(vocab, hidden // 32) * 0.01)
    model.set_input_embeddings(QuantizedEmbedding(model.get_input_embeddings(), model.lm_head, shared=True))
    every_id = torch.arange(vocab)
    want = model.get_input_embeddings()(every_id)
    for rank in (0, 1):
        shard = shard_model(model, rank, 2, comm=None)
        assert shard.lm_head.local.out_features == vocab // 2
        assert torch.equal(shard.get_input_embeddings()(every_id), want)


def test_a_layer_of_a_form_tensor_parallelism_cannot_slice_is_refused_naming_it():
    from specexec.executor.model.decoder.convert import convert_to_own_decoder
    from specexec.executor.parallel.sharding import check_shardable

    _, model = make_tiny_model("llama")
    convert_to_own_decoder(model)
    model.model.layers[1].o_proj = torch.nn.Identity()
    with pytest.raises(ValueError, match="cannot slice layer 1's o_proj .a Identity."):
        check_shardable(model, 2)


def test_eagle3_and_captured_hidden_states_come_back_from_rank_0(tmp_path):
    """The residual stream is whole on every rank after each layer's all-reduce: rank 0 sends the
    captured layers back, so EAGLE-3 drafts in the front as in one process."""
    from eagle3_heads import eagle_spec, make_head_dir

    make_head_dir(tmp_path)
    assert generate("llama", 2, eagle_spec(tmp_path)) == generate("llama", 1, eagle_spec(tmp_path))
    hidden = {}
    for tp in (1, 2):
        _, model = make_tiny_model("llama")
        config = drafting_config(tensor_parallel_size=tp, capture_hidden_layers=[0, 1, 2])
        with Executor(model, config) as executor:
            seq = SequenceInput(PROMPTS[1], 0, list(range(6)), 1)
            hidden[tp] = executor.core.runner.forward([seq]).hidden_states
    assert set(hidden[2]) == {0, 1, 2}
    for layer in (0, 1, 2):
        torch.testing.assert_close(hidden[2][layer], hidden[1][layer])


def kill_rank_mid_run(executor, rank: int) -> dict:
    """Start every prompt, kill ``rank`` after one step, run to the end: {request_id: output}."""
    pids = executor.core.runner.worker_pids()
    for i, p in enumerate(PROMPTS):
        executor.add_request(Request(p, SamplingParams(max_tokens=30, ignore_eos=True), request_id=f"r{i}"))
    executor.step()
    os.kill(pids[rank], signal.SIGKILL)
    start, finished = time.monotonic(), {}
    while executor.core.has_unfinished():
        for event in executor.step():
            if event.finished:
                finished[event.request_id] = event.output
    assert time.monotonic() - start < 20
    assert no_workers_left([pids[rank]])
    return finished


def test_a_killed_worker_fails_the_requests_in_flight_naming_its_rank_then_the_ranks_restart():
    """The requests holding pages fail naming the rank; the ranks start again (their caches empty, the
    cached pages dropped) and a later request gets one process's tokens; past tensor_parallel_max_restarts
    later requests are refused with the cause; no process is left."""
    _, model = make_tiny_model("llama")
    config = drafting_config(
        tensor_parallel_size=2,
        tensor_parallel_timeout_s=20,
        tensor_parallel_max_restarts=1,
        enable_prefix_caching=True,
    )
    executor = Executor(model, config)
    later = Request(PROMPTS[1], SamplingParams(max_tokens=8, ignore_eos=True))
    for attempt in (1, 2):
        finished = kill_rank_mid_run(executor, rank=1)
        assert len(finished) == len(PROMPTS)
        for output in finished.values():
            assert output.error is not None and "rank 1" in output.error, output.error
        assert_all_pages_free(executor)
        (after,) = executor.run([later])
        if attempt == 1:
            assert after.error is None and executor.core.runner.restarts == 1
            assert after.token_ids == generate("llama", 1)[1][:8], (
                "the restarted ranks give one process's tokens"
            )
        else:
            assert after.error is not None and "rank 1" in after.error, (
                "past the restarts: refused with the cause"
            )
    pids = executor.core.runner.worker_pids()
    executor.close()
    assert no_workers_left(pids)
    with pytest.raises(TensorParallelError, match="rank 1"):
        executor.core.runner.forward([])


def test_close_stops_every_worker():
    _, model = make_tiny_model("llama")
    executor = Executor(model, drafting_config(tensor_parallel_size=2))
    pids = executor.core.runner.worker_pids()
    executor.run([Request([1, 2, 3], SamplingParams(max_tokens=2))])
    executor.close()
    assert no_workers_left(pids)


@pytest.mark.slow
def test_smollm2_at_two_and_three_ranks_gives_the_single_process_tokens():
    """The default SmolLM2-135M GGUF (9 heads, 3 KV heads: 3 ranks hold one KV head each, 2 ranks hold 2
    and 1), each rank holding its slices of the file's Q4_1 codes, on real prompts, greedy, in float32 on
    torch's kernels: the file's model exactly (int8_dot rounds the activations to int8, so a sum split
    over ranks in another order can flip a rounding: the benchmark reports that match rate)."""
    from specexec.executor.model.model_loader import load_model
    from specexec.prompt_sets.datasets import load_dataset

    # 3 prompts: their prefill's rows reach DENSE_FROM_ROWS (torch's float32 int4 kernel is slow on them)
    prompts = [p.messages for p in load_dataset("specbench", 3)]
    loaded = load_model(None, dtype="float32", progress=False, quantization="gguf", model_impl="auto")
    tokens = {}
    for tp in (1, 2, 3):
        config = drafting_config(
            tensor_parallel_size=tp,
            dtype="float32",
            quantized_kernel="torch",
            max_num_tokens=256,
            num_kv_blocks=64,
        )
        with Executor(loaded.model, config, tokenizer=loaded.tokenizer) as executor:
            outputs = executor.run([Request(m, SamplingParams(max_tokens=8)) for m in prompts])
            assert all(o.error is None for o in outputs), [o.error for o in outputs]
            tokens[tp] = [o.token_ids for o in outputs]
    assert tokens[2] == tokens[1] and tokens[3] == tokens[1]
    with pytest.raises(ValueError, match="9 attention heads, 3 KV heads"):
        Executor(
            loaded.model, drafting_config(tensor_parallel_size=4, dtype="float32"), tokenizer=loaded.tokenizer
        )


def test_workers_exit_when_the_front_process_is_killed(tmp_path):
    """A front killed with SIGKILL (no close, no atexit) leaves no worker behind: each notices its
    parent is gone within a second."""
    import subprocess
    import sys

    script = tmp_path / "front.py"
    script.write_text(
        "import sys, time\n"
        "sys.path[:0] = sys.argv[1:]\n"
        "from specexec import Executor\n"
        "from factories import drafting_config\n"
        "from tiny_models import make_tiny_model\n"
        "_, model = make_tiny_model('llama')\n"
        "executor = Executor(model, drafting_config(tensor_parallel_size=2))\n"
        "print(*executor.core.runner.worker_pids(), flush=True)\n"
        "time.sleep(600)\n"
    )
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tiny_models, factories
    front = subprocess.Popen([sys.executable, str(script), tests_dir], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in front.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        front.kill()
        front.wait()
        front.stdout.close()
    assert no_workers_left(pids)
