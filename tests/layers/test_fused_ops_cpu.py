"""The own decoder's fused C++ CPU ops against the torch ops they replace: the residual add with its
RMSNorm (both conventions), RoPE with the K/V cache write, and act(gate) * up, in float32, bfloat16 and
float16 on awkward sizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from specexec.executor.layers.activation import act_mul, fused_activation_code
from specexec.executor.layers.cpu_kernels import cpu_kernels
from specexec.executor.layers.rotary import RotaryTable, apply_rotary
from transformers.activations import ACT2FN

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
#: float32: a few ulps (one-pass sums); the 16-bit types: their rounding of each step, as torch rounds
TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float16: 2e-3}


pytestmark = pytest.mark.usefixtures("cpu_ops_built")


def reference_norm(x, weight, eps, unit_offset):  # transformers' two conventions
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if unit_offset:
        return (normed * (1.0 + weight.float())).to(x.dtype)
    return weight * normed.to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("unit_offset", [False, True])
@pytest.mark.parametrize(("rows", "dim"), [(1, 576), (7, 48), (33, 100)])
def test_add_rms_norm_gives_the_add_and_the_norm(dtype, unit_offset, rows, dim):
    gen = torch.Generator().manual_seed(rows * dim)
    x, residual = (torch.randn(rows, dim, generator=gen).to(dtype) for _ in range(2))
    weight = (torch.randn(dim, generator=gen) * 0.3 + (0 if unit_offset else 1)).to(dtype)
    out, total = cpu_kernels().add_rms_norm(x, residual, weight, 1e-5, unit_offset)
    assert torch.equal(total, residual + x), "the add rounds to the dtype as torch's add does"
    want = reference_norm(residual + x, weight, 1e-5, unit_offset)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), want.float(), rtol=tol, atol=tol)
    alone, same = cpu_kernels().add_rms_norm(x, None, weight, 1e-5, unit_offset)
    assert same.data_ptr() == x.data_ptr()
    torch.testing.assert_close(
        alone.float(), reference_norm(x, weight, 1e-5, unit_offset).float(), rtol=tol, atol=tol
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 16), (6, 2, 24)])
def test_rotary_kv_write_rotates_q_and_k_and_stores_k_and_v(dtype, heads, kv_heads, head_dim):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=heads * head_dim, num_attention_heads=heads, head_dim=head_dim)
    table = RotaryTable.from_module(LlamaRotaryEmbedding(config), 128, dtype)
    gen = torch.Generator().manual_seed(heads)
    tokens = 5
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    positions = torch.tensor([0, 3, 17, 99, 127])
    slots = torch.tensor([40, 2, 11, 63, 0])
    pool = torch.zeros(2, 64, kv_heads, head_dim, dtype=dtype)
    rows = table.rows(positions)
    q = cpu_kernels().rotary_kv_write(qkv, rows, pool, slots, heads, kv_heads, head_dim)
    q_want = apply_rotary(qkv[:, : heads * head_dim].view(tokens, heads, head_dim), rows)
    k_want = apply_rotary(
        qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim), rows
    )
    v_want = qkv[:, (heads + kv_heads) * head_dim :].view(tokens, kv_heads, head_dim)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(q.float(), q_want.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(pool[0, slots].float(), k_want.float(), rtol=tol, atol=tol)
    assert torch.equal(pool[1, slots], v_want)
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[slots] = False
    assert not pool[:, untouched].any(), "only the tokens' slots are written"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize(("rows", "intermediate"), [(1, 1536), (5, 37)])
def test_act_mul_is_act_of_gate_times_up(dtype, name, rows, intermediate):
    act = ACT2FN[name]
    code = fused_activation_code(act)
    assert code is not None
    gate_up = torch.randn(rows, 2 * intermediate, generator=torch.Generator().manual_seed(rows)).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(
        act_mul(gate_up, act, code).float(), (act(gate) * up).float(), rtol=tol, atol=tol
    )


def test_an_activation_the_op_does_not_know_runs_on_torch():
    act = torch.nn.ReLU()
    assert fused_activation_code(act) is None
    gate_up = torch.randn(3, 8)
    assert torch.equal(act_mul(gate_up, act, None), F.relu(gate_up[:, :4]) * gate_up[:, 4:])
