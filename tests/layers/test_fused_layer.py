"""The own decoder's layer as one C++ op, and its whole stack of layers as one (`decoder/fused_layer.py`):
the same logits, K/V and recorded hidden states as the Python layers, bit for bit, for the families,
dtypes and linear kernels they take; the Python layer where they cannot run; arguments rebuilt when a
layer's routing changes."""

from __future__ import annotations

import copy

import pytest
import torch
from factories import assert_all_pages_free, drafting_config, greedy_requests
from specexec.executor.executor import Executor
from specexec.executor.kernel_plan.quantized_kernel import QuantizedKernelChoice, set_int8_dot
from specexec.executor.layers.attention_kernels import PAGED_CPU, SDPA
from specexec.executor.layers.packed_linear import PackedLinear, can_pack
from specexec.executor.layers.quantized.q8_block_linear import Int8BlockLinear
from specexec.executor.layers.quantized.quantized_linear import (
    DENSE,
    ONEDNN,
    Q4_INT8_DOT,
    Q8_OFFSET_INT8_DOT,
    TORCH_INT4,
    Int4WeightOnlyLinear,
)
from specexec.executor.model.attention_paths import AttentionPaths
from specexec.executor.model.decoder import forward as decoder_forward
from specexec.executor.model.decoder import fused_layer
from specexec.executor.model.forward_io import SequenceInput
from speculative_runs import MAX_TOKENS
from tiny_models import make_prompts, make_tiny_model
from torch import nn

pytestmark = pytest.mark.usefixtures("cpu_ops_built")


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the layers that ran as one op, alone or in the stack's op."""
    calls = []
    real_layer, real_stack = decoder_forward.run_fused, decoder_forward.run_stack

    def counting_layer(*args):
        calls.append(args[0].spec.layer_idx)
        return real_layer(*args)

    def counting_stack(stack, *args):
        calls.extend(stack.layer_idx)
        return real_stack(stack, *args)

    monkeypatch.setattr(decoder_forward, "run_fused", counting_layer)
    monkeypatch.setattr(decoder_forward, "run_stack", counting_stack)
    return calls


def python_only(monkeypatch):
    monkeypatch.setattr(decoder_forward.FusedStep, "of", classmethod(lambda cls, meta, hidden: None))


def layer_by_layer(monkeypatch):
    """Each layer as its own op: no stack."""
    monkeypatch.setattr(decoder_forward, "fused_stack", lambda layers, rows, dtype: None)


def executor_for(arch, dtype, quantization=None, kernel="torch", **overrides):
    _, model = make_tiny_model(arch, dtype=dtype)
    settings = dict(
        dtype=str(dtype).removeprefix("torch."),
        quantization=quantization,
        quantized_kernel=kernel,
        model_impl="specexec",
        cpu_linear="blas",
    )
    config = drafting_config(**{**settings, **overrides})
    executor = Executor(model, config)
    executor.core.runner.attention_paths = AttentionPaths.all(PAGED_CPU)
    return executor


def forwards(executor) -> list[torch.Tensor]:
    """Logits of a prefill, a decode row, a 4-row verify (and the hidden states recorded then), 3
    requests decoding together, the 3 verifying 3, 1 and 2 tokens together, and their K/V."""
    runner, bm = executor.core.runner, executor.block_manager
    for name in ("a", "b", "c"):
        bm.allocate(name, 40)
    out = [runner.forward([SequenceInput(list(range(3, 23)), 0, bm.block_tables["a"], 1)]).logits]
    out.append(runner.forward([SequenceInput([7], 20, bm.block_tables["a"], 1)]).logits)
    verify = runner.forward([SequenceInput([9, 4, 11, 2], 21, bm.block_tables["a"], 4)])
    out.append(verify.logits)
    out += [verify.hidden_states[i] for i in sorted(verify.hidden_states)]
    for name in ("b", "c"):
        runner.forward([SequenceInput(list(range(5, 17)), 0, bm.block_tables[name], 1)])
    batch = [SequenceInput([8], 25 if n == "a" else 12, bm.block_tables[n], 1) for n in ("a", "b", "c")]
    out.append(runner.forward(batch).logits)
    # query lengths 3, 1, 2 in one group: the op gathers the padded group's rows and picks the output's
    mixed = [
        SequenceInput([8, 9, 10], 26, bm.block_tables["a"], 3),
        SequenceInput([3], 13, bm.block_tables["b"], 1),
        SequenceInput([4, 5], 13, bm.block_tables["c"], 2),
    ]
    out.append(runner.forward(mixed).logits)
    block = runner.kv_cache.block_size
    for name, length in (("a", 29), ("b", 14), ("c", 15)):  # each request's K/V, wherever its pages are
        pages = torch.tensor(bm.block_tables[name])
        slots = pages[torch.arange(length) // block] * block + torch.arange(length) % block
        out.append(runner.kv_cache.kv[..., slots, :, :])
        bm.free(name)
    return [t.clone() for t in out]


CASES = [
    ("llama", torch.float32, None, "torch"),
    ("llama", torch.bfloat16, None, "torch"),
    ("llama", torch.float32, "int4", "torch"),
    ("llama", torch.float32, "int4", "int8_dot"),
    ("llama", torch.bfloat16, "int8", "int8_dot"),
    ("llama", torch.bfloat16, "int8", "torch"),
    ("mistral", torch.float32, "int4", "int8_dot"),  # its sliding window
    ("qwen2", torch.float32, None, "torch"),  # q/k/v biases
    ("qwen2", torch.float32, "int4", "int8_dot"),
]


@pytest.mark.parametrize(("arch", "dtype", "quantization", "kernel"), CASES)
def test_the_op_gives_the_python_layers_logits_and_pages_bit_for_bit(
    arch, dtype, quantization, kernel, fused_calls, monkeypatch
):
    with executor_for(arch, dtype, quantization, kernel) as executor:
        runner = executor.core.runner
        runner.capture((0, 1, runner.model.config.num_hidden_layers))  # as EAGLE-3 records them
        stacked = forwards(executor)
        assert fused_calls, "the stack's op ran"
        layer_by_layer(monkeypatch)
        fused = forwards(executor)
        num_fused = len(fused_calls)
        python_only(monkeypatch)
        plain = forwards(executor)
        assert len(fused_calls) == num_fused
    assert len(stacked) == len(plain) == 4 + 3 + 1 + 3
    for got_stacked, got, want in zip(stacked, fused, plain):
        assert torch.equal(got_stacked, want)
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layers_packed_for_onednn_run_in_the_op_as_they_run_in_python(dtype, fused_calls, monkeypatch):
    """``cpu_linear: onednn``: each packed layer is the op's oneDNN call, with its bias inside it, as
    `PackedLinear.forward` makes it (qwen2: q/k/v biases)."""
    if not can_pack(dtype):
        pytest.fail(f"oneDNN cannot pack {dtype} on this CPU; the test machines' CPUs can")
    with executor_for("qwen2", dtype, cpu_linear="onednn") as executor:
        layer = executor.model.model.layers[0]
        assert type(layer.qkv_proj) is PackedLinear and layer.qkv_proj.bias is not None
        assert fused_layer.fused_args(layer, 1, dtype).weights[4] == [ONEDNN] * 4
        stacked = forwards(executor)
        assert fused_calls, "the op ran"
        copy.deepcopy(executor.model)  # the arguments kept for the op (packed weights) are not on it
        python_only(monkeypatch)
        plain = forwards(executor)
    for got, want in zip(stacked, plain):
        assert torch.equal(got, want)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_families_with_q_k_norms_or_gemmas_norms_run_in_python(arch, fused_calls):
    with executor_for(arch, torch.float32) as executor:
        forwards(executor)
    assert fused_calls == []


def test_steps_the_op_cannot_take_run_in_python(fused_calls):
    with executor_for("llama", torch.float32) as executor:
        executor.core.runner.attention_paths = AttentionPaths.all(SDPA)  # not the C++ attention kernel
        forwards(executor)
        assert fused_calls == []
    with executor_for("llama", torch.float64) as executor:  # a dtype the C++ ops do not take
        forwards(executor)
        assert fused_calls == []


def test_int8_block_layers_with_offsets_run_in_the_op_as_they_run_in_python(fused_calls, monkeypatch):
    """A GGUF's Q5_K or Q5_1 layer (int8 codes, a scale and an offset per 32 inputs) is the op's q8 call
    with its offsets."""
    with executor_for("llama", torch.float32, "int4", "int8_dot") as executor:
        generator = torch.Generator().manual_seed(13)
        for layer in executor.model.model.layers:
            for parent in layer.modules():
                for name, child in list(parent.named_children()):
                    if not isinstance(child, Int4WeightOnlyLinear):
                        continue
                    linear = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
                    out, blocks = child.out_features, child.in_features // 32
                    q = torch.randint(0, 32, (out, child.in_features), generator=generator, dtype=torch.int8)
                    scale = torch.rand(out, blocks, generator=generator) * 0.01
                    offset = torch.randn(out, blocks, generator=generator) * 0.01
                    setattr(parent, name, Int8BlockLinear(linear, q, scale, offset))
        layer = executor.model.model.layers[0]
        assert fused_layer.fused_args(layer, 1, torch.float32).weights[4] == [Q8_OFFSET_INT8_DOT] * 4
        assert {m.code_bits for m in layer.modules() if isinstance(m, Int8BlockLinear)} == {5}  # 5-bit tiles
        stacked = forwards(executor)
        assert fused_calls, "the op ran"
        python_only(monkeypatch)
        plain = forwards(executor)
    for got, want in zip(stacked, plain):
        assert torch.equal(got, want)


def test_the_layers_arguments_follow_their_routing(fused_calls, monkeypatch):
    with executor_for("llama", torch.float32, "int4", "torch") as executor:
        layers = executor.model.model.layers
        layer = layers[0]
        first = fused_layer.fused_args(layer, 1, torch.float32)
        assert first.weights[4] == [TORCH_INT4] * 4
        forwards(executor)  # the stack's arguments are built and kept
        stack = fused_layer.fused_stack(layers, 1, torch.float32)
        assert stack is fused_layer.fused_stack(layers, 1, torch.float32), "kept while valid"
        set_int8_dot([executor.model], QuantizedKernelChoice("int8_dot", "test", 16, 16))
        rebuilt = fused_layer.fused_stack(layers, 1, torch.float32)
        assert rebuilt is not stack and rebuilt.kinds == [Q4_INT8_DOT] * 4 * len(layers)
        second = fused_layer.fused_args(layer, 1, torch.float32)
        assert second is not first and second.weights[4] == [Q4_INT8_DOT] * 4
        assert fused_layer.fused_args(layer, 1, torch.float32) is second, "kept while valid"
        fused = forwards(executor)
        python_only(monkeypatch)
        assert all(torch.equal(a, b) for a, b in zip(fused, forwards(executor)))


def test_an_executor_on_the_op_generates_what_the_python_layers_generate(fused_calls, monkeypatch):
    prompts = [p + p[:6] for p in make_prompts(6, (5, 12, 3, 20), seed=7)]
    spec = {"decoding_type": "NGram", "max_draft_len": 3}

    def run():
        with executor_for("llama", torch.float32, "int4", "int8_dot", speculative_config=spec) as ex:
            outputs = ex.run(greedy_requests(prompts, MAX_TOKENS))
            assert_all_pages_free(ex)
        return [o.token_ids for o in outputs]

    fused = run()
    assert fused_calls
    python_only(monkeypatch)
    assert run() == fused


def test_a_packed_layer_gives_the_op_the_call_its_forward_makes_for_those_rows():
    """Row bands: the BLAS's rows are the dense call, oneDNN's the packed one; MKL's packed GEMM (its one
    row count) is no call the op makes, so such a step runs in Python."""
    from specexec.executor.layers.packed_linear import RowBands, can_pack_mkl

    linear = torch.nn.Linear(64, 32).requires_grad_(False)
    banded = PackedLinear(linear, RowBands((1, 4), (False, True)))
    assert fused_layer.linear_call(banded, 1, torch.float32) == (DENSE, [banded.dense_weight, banded.bias])
    kind, tensors = fused_layer.linear_call(banded, 4, torch.float32)
    assert kind == ONEDNN and tensors[0] is banded.packed and tensors[1] is banded.bias
    assert fused_layer.linear_call(banded, 4, torch.bfloat16) is None, "another dtype"
    if not can_pack_mkl(torch.float32):
        pytest.fail("this torch build has no MKL packed GEMM; torch's CPU wheels do")
    mkl = PackedLinear(linear, mkl_rows=4)
    assert fused_layer.linear_call(mkl, 4, torch.float32) is None
    assert fused_layer.linear_call(mkl, 1, torch.float32)[0] == ONEDNN


def test_requests_verifying_different_numbers_of_tokens_run_in_the_op(fused_calls):
    """One short-query group holds requests with 3, 1 and 2 new tokens (an NGram step where some found
    no drafts); the stack's op takes it, its rows laid out as the Python layers lay them out."""
    with executor_for("llama", torch.float32) as executor:
        runner, bm = executor.core.runner, executor.block_manager
        for name in ("a", "b", "c"):
            bm.allocate(name, 40)
            runner.forward([SequenceInput(list(range(3, 13)), 0, bm.block_tables[name], 1)])
        fused_calls.clear()
        lengths = {"a": 3, "b": 1, "c": 2}
        step = [SequenceInput([5] * n, 10, bm.block_tables[name], n) for name, n in lengths.items()]
        logits = runner.forward(step).logits
        assert sorted(fused_calls) == list(range(runner.model.config.num_hidden_layers))
        assert logits.shape[0] == 6
        for name in lengths:
            bm.free(name)
