"""specexec's own decoder (`model_impl: specexec`) against transformers' modules (`model_impl:
transformers`): the same greedy tokens in float64 for every family and every drafter, at batch 1 and 8,
guided and not, with preemption; logits within float32 tolerance in float32; and the choice between
them (`auto`) made and reported as the docs say."""

from __future__ import annotations

import functools

import pytest
import torch
from eagle3_heads import eagle_spec, make_head_dir
from factories import assert_all_pages_free, greedy_requests, tiny_config
from specexec import Executor, ExecutorConfig, FinishReason
from specexec.drafters.draft_target import DraftTargetDrafter
from specexec.executor.layers import cpu_kernels as kernels_module
from specexec.executor.layers.norm import RMSNorm
from specexec.executor.layers.rotary import RotaryTable, apply_rotary
from specexec.executor.model.decoder.convert import convert_to_own_decoder, is_own_decoder, unsupported_reason
from speculative_runs import BATCHES, make_independent_draft_model
from tiny_models import ARCHS, EXTRA_ARCHS, make_prompts, make_tiny_model

FAMILIES = ARCHS + EXTRA_ARCHS  # llama, qwen2, qwen3, mistral, gemma3, gemma2
BLOCK = 4  #: tokens per KV page of the model runners built below
MAX_TOKENS = 16
#: a pool small enough that eight requests take pages back from each other (preemption)
SMALL_POOL = 40


def pool_for(batch: str) -> int:
    return SMALL_POOL if batch == "batch8" else 128


@functools.cache
def transformers_tokens(arch: str, batch: str) -> list[list[int]]:
    """Greedy output of transformers' modules without drafts (the reference)."""
    _, model = make_tiny_model(arch)
    executor = Executor(model, tiny_config(model_impl="transformers", num_kv_blocks=pool_for(batch)))
    assert executor.setup.model_impl.impl == "transformers" and not is_own_decoder(executor.model)
    return [o.token_ids for o in executor.run(greedy_requests(BATCHES[batch], MAX_TOKENS))]


def spec_and_drafter(name: str, tmp_path):
    if name == "ngram":
        return {"decoding_type": "NGram", "max_draft_len": 4}, None
    if name == "self-int8":
        return {"decoding_type": "DraftTarget", "max_draft_len": 4}, None
    if name == "draft-model":
        return None, DraftTargetDrafter(
            make_independent_draft_model(), 4, 256, num_kv_blocks=128, block_size=4
        )
    if name == "eagle3":
        make_head_dir(tmp_path)
        return eagle_spec(tmp_path), None
    return None, None


@pytest.mark.parametrize("batch", ["batch1", "batch8"])
@pytest.mark.parametrize("drafter", ["none", "ngram", "self-int8", "draft-model", "eagle3"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_the_own_decoder_gives_transformers_tokens(arch, drafter, batch, tmp_path):
    spec, drafter_module = spec_and_drafter(drafter, tmp_path)
    _, model = make_tiny_model(arch)
    config = tiny_config(model_impl="specexec", num_kv_blocks=pool_for(batch), speculative_config=spec)
    executor = Executor(model, config, drafter=drafter_module)
    assert executor.setup.model_impl.impl == "specexec" and is_own_decoder(executor.model)
    outputs = executor.run(greedy_requests(BATCHES[batch], MAX_TOKENS))
    assert all(o.finish_reason is FinishReason.LENGTH for o in outputs), [o.error for o in outputs]
    assert [o.token_ids for o in outputs] == transformers_tokens(arch, batch)
    if batch == "batch8":
        assert sum(o.metrics.num_preemptions for o in outputs) > 0, "the small pool preempted nobody"
    if drafter not in ("none", "ngram"):  # (NGram drafts only where the text repeats)
        assert sum(o.metrics.num_draft_tokens for o in outputs) > 0
    assert_all_pages_free(executor)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_guided_requests_give_the_same_tokens_on_both_decoders(arch):
    from grammar_support import smollm2_tokenizer
    from guided_runs import person_requests

    tokens = {}
    for impl in ("transformers", "specexec"):
        _, model = make_tiny_model(arch, vocab_size=49152)
        spec = {"decoding_type": "NGram", "max_draft_len": 3}
        config = tiny_config(
            model_impl=impl,
            num_kv_blocks=256,
            block_size=8,
            guided_json_max_whitespace=0,
            speculative_config=spec,
        )
        executor = Executor(model, config, tokenizer=smollm2_tokenizer())
        outputs = executor.run(person_requests(4))
        assert all(o.guided_valid for o in outputs if o.finish_reason is FinishReason.STOP)
        tokens[impl] = [o.token_ids for o in outputs]
        assert_all_pages_free(executor)
    assert tokens["specexec"] == tokens["transformers"]
    assert any(tokens["specexec"]), "no guided token was generated"


@pytest.mark.parametrize("arch", FAMILIES)
def test_float32_logits_are_within_float32_tolerance_of_transformers(arch):
    reference, model = make_tiny_model(arch, dtype=torch.float32)
    executor = Executor(model, tiny_config(model_impl="specexec", dtype="float32", cpu_linear="blas"))
    prompt = make_prompts(1, 13, seed=5)[0]
    bm, runner = executor.block_manager, executor.core.runner
    bm.allocate("s", len(prompt))
    from specexec.executor.model.forward_io import SequenceInput

    out = runner.forward([SequenceInput(prompt, 0, bm.block_tables["s"], len(prompt))])
    with torch.no_grad():
        want = reference(torch.tensor([prompt])).logits[0]  # [13, vocab]
    torch.testing.assert_close(out.logits, want, rtol=1e-4, atol=1e-4)
    bm.free("s")


def test_auto_takes_the_own_decoder_and_transformers_keeps_its_modules():
    _, model = make_tiny_model("qwen3")
    auto = Executor(model, tiny_config(model_impl="auto"))
    assert auto.setup.model_impl.impl == "specexec" and "Qwen3ForCausalLM" in auto.setup.model_impl.reason
    _, other = make_tiny_model("qwen3")
    kept = Executor(other, tiny_config(model_impl="transformers"))
    assert (
        kept.setup.model_impl.impl == "transformers"
        and type(other.model.layers[0]).__name__ == "Qwen3DecoderLayer"
    )


def test_a_model_the_own_decoder_cannot_run_falls_back_under_auto_and_is_refused_under_specexec():
    # dynamic rope changes its frequencies with the sequence length: no fixed table holds it
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    _, model = make_tiny_model("llama", rope_parameters=dynamic)
    assert "depends on the sequence length" in unsupported_reason(model)
    executor = Executor(model, tiny_config(model_impl="auto"))
    assert (
        executor.setup.model_impl.impl == "transformers"
        and "sequence length" in executor.setup.model_impl.reason
    )
    assert len(executor.run(greedy_requests([[1, 2, 3]], MAX_TOKENS))[0].token_ids) == MAX_TOKENS
    _, refused = make_tiny_model("llama", rope_parameters=dynamic)
    with pytest.raises(ValueError, match="model_impl.*'specexec' cannot run this model: rope type"):
        Executor(refused, tiny_config(model_impl="specexec"))


def test_converting_twice_changes_nothing_and_a_converted_module_cannot_go_back():
    _, model = make_tiny_model("llama")
    convert_to_own_decoder(model)
    layers = list(model.model.layers)
    convert_to_own_decoder(model)
    assert list(model.model.layers) == layers
    assert (
        Executor(model, tiny_config(model_impl="auto")).setup.model_impl.reason
        == "converted by an earlier executor"
    )
    with pytest.raises(ValueError, match="converted to specexec's decoder by an earlier executor"):
        Executor(model, tiny_config(model_impl="transformers"))


def test_the_fused_layers_hold_the_checkpoints_rows_in_order():
    reference, model = make_tiny_model("qwen2")  # q/k/v biases
    convert_to_own_decoder(model)
    hf, ours = reference.model.layers[1], model.model.layers[1]
    attn, mlp = hf.self_attn, hf.mlp
    assert torch.equal(
        ours.qkv_proj.weight, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    )
    assert torch.equal(ours.qkv_proj.bias, torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
    assert torch.equal(ours.gate_up_proj.weight, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    assert type(ours.qkv_proj) is torch.nn.Linear and type(ours.gate_up_proj) is torch.nn.Linear


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantized_fused_layers_equal_the_separately_quantized_layers(scheme):
    """Both schemes quantize each output row on its own, so fusing before quantizing changes no weight."""
    from specexec.executor.layers.quantized.quantization import quantize_model

    _, separate = make_tiny_model("llama", dtype=torch.float32)
    _, fused = make_tiny_model("llama", dtype=torch.float32)
    convert_to_own_decoder(fused)
    quantize_model(separate, scheme)
    report = quantize_model(fused, scheme)
    assert sum(report.layers.values()) == 4 * 7 + 1, "a fused layer counts the checkpoint layers it holds"
    attn = separate.model.layers[2].self_attn
    parts = [attn.q_proj, attn.k_proj, attn.v_proj]
    want = torch.cat([p.dequantized(torch.float32) for p in parts])
    assert torch.equal(fused.model.layers[2].qkv_proj.dequantized(torch.float32), want)


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_rms_norm_gives_the_modules_numbers(arch, monkeypatch):
    """Bit for bit on torch ops (float64, and float32 with the C++ ops off); the C++ op's one-pass sum
    in float32 to within a few ulps; with the residual add, the add's sum too."""
    reference, _ = make_tiny_model(arch, dtype=torch.float32)
    module = reference.model.layers[0].input_layernorm
    torch.nn.init.normal_(module.weight, std=0.3)
    ours = RMSNorm.from_module(module)
    x, residual = torch.randn(5, 32), torch.randn(5, 32)
    for dtype in (torch.float32, torch.float64):
        norm, mine = module.to(dtype), ours.to(dtype)
        got, total = mine.add_forward(x.to(dtype), residual.to(dtype))
        want_total = residual.to(dtype) + x.to(dtype)
        assert torch.equal(total, want_total)
        tolerance = 0 if dtype == torch.float64 else 1e-6
        torch.testing.assert_close(got, norm(want_total), rtol=tolerance, atol=tolerance)
    monkeypatch.setenv(kernels_module.SWITCH, "0")
    kernels_module.cpu_kernels.cache_clear()
    try:
        assert torch.equal(ours.to(torch.float32)(x), module.to(torch.float32)(x))
    finally:
        monkeypatch.delenv(kernels_module.SWITCH)
        kernels_module.cpu_kernels.cache_clear()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_rotary_table_and_rotation_are_transformers_own(arch):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    reference, _ = make_tiny_model(arch)
    rotary = reference.model.rotary_emb
    extra = ("sliding_attention",) if arch == "gemma3" else ()
    table = RotaryTable.from_module(rotary, 64, torch.float64, *extra)
    positions = torch.tensor([0, 5, 17, 63])
    cos, sin = rotary(torch.zeros(1, dtype=torch.float64), positions[None], *extra)
    q, k = torch.randn(1, 4, 4, 8, dtype=torch.float64), torch.randn(1, 2, 4, 8, dtype=torch.float64)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)  # [1, heads, T, head_dim]
    rows = table.rows(positions)
    torch.testing.assert_close(
        apply_rotary(q[0].transpose(0, 1), rows), want_q[0].transpose(0, 1), rtol=0, atol=1e-15
    )
    torch.testing.assert_close(
        apply_rotary(k[0].transpose(0, 1), rows), want_k[0].transpose(0, 1), rtol=0, atol=1e-15
    )


# ---- CUDA graphs: what a CPU can check ----------------------------------------------------------------


@pytest.mark.parametrize("arch", FAMILIES)
def test_the_own_decoders_captured_forward_reads_no_value_and_takes_no_host_data(arch):
    from capture_checks import CapturabilityCheck
    from specexec.executor.model.graph_shapes import GraphShapes
    from specexec.executor.model.kv_cache import KVCache, KVCacheSpec
    from specexec.executor.model.model_runner import ModelRunner

    _, model = make_tiny_model(arch)
    model = model.to("meta")
    convert_to_own_decoder(model)
    spec = KVCacheSpec.from_model_config(model.config, torch.float64)
    runner = ModelRunner(model, KVCache(spec, 32, BLOCK, torch.device("meta")), 64, (1, 2, 4))
    assert runner.model_impl == "specexec"
    report = runner.capture_graphs(GraphShapes.for_model(4, (1, 3), 16, BLOCK, 64), CapturabilityCheck())
    assert report.error is None, report.error
    assert report.num_graphs == 3 * 2


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_replayed_own_decoder_step_returns_what_its_eager_forward_returns(arch):
    from specexec.executor.model.cuda_graphs import EagerReplay
    from specexec.executor.model.forward_io import SequenceInput
    from specexec.executor.model.graph_shapes import GraphShapes
    from specexec.executor.model.kv_cache import KVCache, KVCacheSpec
    from specexec.executor.model.model_runner import ModelRunner

    _, model = make_tiny_model(arch)
    convert_to_own_decoder(model)
    spec = KVCacheSpec.from_model_config(model.config, torch.float64)
    runner = ModelRunner(model, KVCache(spec, 64, BLOCK, torch.device("cpu")), 128, (1, 4))
    tables = [list(range(0, 4)), list(range(10, 13)), list(range(20, 28))]
    prompts = [list(range(5, 18)), list(range(40, 46)), list(range(60, 90))]  # past gemma3's window
    runner.forward([SequenceInput(p, 0, t, 1) for p, t in zip(prompts, tables)])
    step = [
        SequenceInput([7], 13, tables[0], 1),
        SequenceInput([8, 9, 10, 11], 6, tables[1], 4),
        SequenceInput([12, 13], 30, tables[2], 1),
    ]
    eager = runner.forward(step)
    report = runner.capture_graphs(GraphShapes.for_model(4, (1, 4), 16, BLOCK, 128), EagerReplay())
    assert report.error is None
    replayed = runner.forward(step)
    assert runner.graphs.stats.num_eager == 0
    torch.testing.assert_close(replayed.logits, eager.logits, rtol=1e-12, atol=1e-12)
    for layer in (1, 4):
        torch.testing.assert_close(replayed.hidden_states[layer], eager.hidden_states[layer])


# ---- the embedded SmolLM2 at its GGUF's own codes ----------------------------------------------------------


@pytest.mark.slow
def test_fused_gguf_layers_hold_the_files_codes_exactly_in_float32():
    """The Q4_1 codes of q/k/v (and gate/up) stacked into one int4 layer multiply by exactly the
    converted float32 weights, and the executor counts the file's 210 Q4_1 tensors."""
    from specexec.executor.layers.quantized.quantized_linear import Int4WeightOnlyLinear
    from specexec.executor.model.model_loader import load_model

    dense = load_model(None, dtype="float32", progress=False).model
    config = ExecutorConfig(
        dtype="float32",
        quantization="gguf",
        model_impl="specexec",
        cpu_linear="blas",
        quantized_kernel="torch",  # torch's int4 kernel, exact in float32 (int8_dot: tests/layers/test_quantized_dot.py)
        num_kv_blocks=16,
        progress=False,
    )
    with Executor(config=config) as executor:
        assert executor.setup.quantization.layers == {"Q4_1 -> int4 (exact)": 210, "Q8_0 -> dense": 1}
        for i in (0, 17, 29):
            ours, theirs = executor.model.model.layers[i], dense.model.layers[i]
            attn, mlp = theirs.self_attn, theirs.mlp
            wanted = {
                "qkv_proj": torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
                "gate_up_proj": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                "o_proj": attn.o_proj.weight,
                "down_proj": mlp.down_proj.weight,
            }
            for name, want in wanted.items():
                layer = getattr(ours, name)
                assert isinstance(layer, Int4WeightOnlyLinear), name
                assert torch.equal(layer.dequantized(torch.float32), want), (i, name)
                eye = torch.eye(layer.in_features)
                assert torch.equal(layer(eye).t(), want), (i, name)  # the kernel itself, in float32
