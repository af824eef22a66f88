"""NaN and Inf in the C++ CPU ops' inputs reach their outputs where torch ops would spoil them, so that
the engine's row check fails the request ("the model's logits hold NaN ...") instead of reading a
plausible number: int8_dot's activation quantization (a block that is not finite makes its row's outputs
NaN), the attention kernel's softmax (its vector, plain and bfloat16-dot paths), and a whole request on a
quantized model through the fused decoder layers."""

from __future__ import annotations

import pytest
import torch
from factories import drafting_config
from paged_attention_cases import TOLERANCE, make_case
from quantized_weights import random_q4
from specexec import Executor, FinishReason, Request, SamplingParams
from specexec.executor.layers.attention_kernels import MATMUL, PAGED_CPU, SDPA
from specexec.executor.layers.paged_attention_cpu import attend_paged_cpu
from specexec.executor.layers.quantized.quantized_dot import (
    BLOCK,
    pack_q4,
    pack_q8,
    q4_linear,
    q8_linear,
    tile_block_scales,
)
from specexec.executor.model.attention_paths import AttentionPaths
from specexec.executor.model.paged_attention import _attend_gathered
from tiny_models import make_tiny_model

NONFINITE = [float("nan"), float("inf"), float("-inf")]


pytestmark = pytest.mark.usefixtures("cpu_ops_built")


def int8_dot_layers(in_features: int, out_features: int):
    """The three int8_dot products (Q4, int8 with a row's scale, Q8_0 with a block's) as x -> [M, out]."""
    gen = torch.Generator().manual_seed(out_features)
    weights = random_q4(out_features, in_features, seed=3)
    q4 = pack_q4(weights.q, weights.scale, weights.offset)
    q8 = pack_q8(torch.randint(-128, 128, (out_features, in_features), generator=gen, dtype=torch.int8))
    row_scale = torch.rand(out_features, generator=gen) * 0.01
    block_scale = tile_block_scales(torch.rand(out_features, in_features // BLOCK, generator=gen) * 0.01)
    return {
        "q4": lambda x: q4_linear(x, q4),
        "q8_row": lambda x: q8_linear(x, q8, row_scale),
        "q8_block": lambda x: q8_linear(x, q8, block_scale),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("value", NONFINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("rows", [3, 18])  # 18: AVX-512 builds take two tiles a pass from 16 rows
def test_a_nonfinite_activation_makes_its_output_row_nan_and_no_other(dtype, value, rows):
    """torch's x @ w^T spoils the row of a NaN (and of an Inf: inf or NaN outputs); the int8 step would
    have rounded it to a plausible code. The other rows are what they are without it."""
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows)).to(dtype)
    poisoned = x.clone()
    poisoned[1, 40] = value
    for name, layer in int8_dot_layers(96, 40).items():
        clean, got = layer(x), layer(poisoned)
        assert got[1].isnan().all(), f"{name}: {got[1]}"
        others = [r for r in range(rows) if r != 1]
        assert torch.equal(got[others], clean[others]), name


def attend_both_ways(cache, meta, query):
    """Each attention group through the C++ kernel and through the torch path: their real rows, in
    pairs (kernel, torch), [rows, heads, head_dim]."""
    heads, head_dim = query.shape[1], query.shape[2]
    for group in meta.groups:
        num, max_q = group.num_queries, group.max_query_len
        if group.query_slice:
            q = query[group.query_slice].view(num, max_q, heads, head_dim)
        else:
            q = query[group.query_index]
        want = _attend_gathered(group, 0, meta, q, MATMUL, head_dim**-0.5, None, None)
        got = attend_paged_cpu(
            q, cache.kv[0], group.block_tables, group.query_pos[..., 0], group.kv_lens, cache.block_size,
            head_dim**-0.5, None, None,
        )  # fmt: skip
        rows = group.valid_rows if group.valid_rows is not None else slice(None)
        yield (
            got.reshape(num * max_q, heads, head_dim)[rows],
            want.reshape(num * max_q, heads, head_dim)[rows],
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 24])  # on the vector width (bfloat16: its dot product), and off
@pytest.mark.parametrize("where", ["query", "key"])
@pytest.mark.parametrize("value", NONFINITE[:2], ids=["nan", "inf"])
def test_a_nonfinite_query_or_key_spoils_the_rows_torch_spoils(dtype, head_dim, where, value):
    """A NaN or Inf score reaches the softmax: torch's gives NaN for the rows that see it (an Inf key
    gives -inf scores too, which only weigh 0), where an exponent clamped at -87.3 had turned a NaN into
    a plausible weight. Requests of 32 and 256 keys: whole vectors, no tail (a tail's std::exp kept the
    NaN), and two chunks merged."""
    cache, meta, query = make_case(dtype, 9, 3, head_dim, 16, [1, 4], [32, 256])
    if where == "query":
        query[4, 4, 5] = value  # request 1's last query (all 256 keys), head 4
    else:  # request 1's key 20 of KV head 1, seen by every query of that request
        group = next(g for g in meta.groups if 256 in g.kv_lens.tolist())
        table = group.block_tables[group.kv_lens.tolist().index(256)]
        cache.kv[0, 0, table[20 // 16] * 16 + 20 % 16, 1, 3] = value
    num_spoiled = 0
    for got, want in attend_both_ways(cache, meta, query):
        assert torch.equal(got.isnan(), want.isnan())
        tolerance = TOLERANCE[dtype]
        torch.testing.assert_close(
            got.double(), want.double(), rtol=tolerance, atol=tolerance, equal_nan=True
        )
        num_spoiled += int(want.isnan().any(-1).sum())
    assert num_spoiled > 0, "the poison must reach a row of the torch path"


POISON = 255  #: a token whose embedding is NaN, only in the bad request's prompt
GOOD_PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [10, 11, 12, 13, 10, 11, 12]]
BAD_PROMPT = [7, 8, POISON, 9, 10]


@pytest.mark.parametrize("attention", [PAGED_CPU, MATMUL, SDPA])
@pytest.mark.parametrize("kernel", ["torch", "int8_dot"])
def test_a_nan_activation_fails_its_request_alone_on_either_kernel(kernel, attention):
    """An int8-quantized float32 model in the own decoder (its layers as one fused op) with one NaN
    embedding row: the request whose prompt holds that token fails with the NaN message, on torch's
    kernels and on int8_dot alike, and the others give what they give without it. (int8_dot had rounded
    the NaN rows to plausible codes: the request ran on, on garbage.) On every attention kernel: the
    others take the failed request's freed pages, whose slots past their keys hold its NaN K/V (the torch
    kernels' page gather had read them, and a masked weight's 0 * NaN is NaN)."""
    _, model = make_tiny_model("llama", dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight[POISON] = float("nan")
    config = drafting_config(
        dtype="float32", quantization="int8", quantized_kernel=kernel, model_impl="specexec"
    )
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    with Executor(model, config) as executor:
        assert executor.setup.quantized_kernel.kernel == kernel
        executor.core.runner.attention_paths = AttentionPaths.all(attention)
        clean = [o.token_ids for o in executor.run([Request(p, params) for p in GOOD_PROMPTS])]
        *good, bad = executor.run([Request(p, params) for p in [*GOOD_PROMPTS, BAD_PROMPT]])
    assert [o.token_ids for o in good] == clean, [(o.finish_reason, o.error) for o in good]
    assert bad.finish_reason is FinishReason.ERROR and "logits hold NaN" in bad.error, bad.error
