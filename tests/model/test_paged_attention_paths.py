"""The two attention paths (SDPA, and float32 matmuls for bf16 decode on CPU) agree."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from specexec.executor.layers.attention_kernels import attend, attend_matmul


def make_inputs(num: int, max_q: int, max_kv: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num, 6, max_q, 16, generator=gen).to(dtype)
    k = torch.randn(num, 2, max_kv, 16, generator=gen).to(dtype)
    v = torch.randn(num, 2, max_kv, 16, generator=gen).to(dtype)
    lengths = torch.randint(1, max_kv + 1, (num,), generator=gen)
    mask = (torch.arange(max_kv)[None, None, None, :] < lengths[:, None, None, None]).expand(
        num, 1, max_q, max_kv
    )
    return q, k, v, mask.contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matmul_path_matches_sdpa(dtype):
    q, k, v, mask = make_inputs(5, 3, 40, dtype)
    reference = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=mask, scale=0.25, enable_gqa=True
    )
    out = attend_matmul(q, k, v, mask, 0.25, None)
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), reference, atol=tol, rtol=tol)


def test_batched_bf16_decode_takes_the_matmul_path_and_agrees():
    q, k, v, mask = make_inputs(4, 1, 64, torch.bfloat16, seed=1)
    torch.testing.assert_close(attend(q, k, v, mask, 0.25, None), attend_matmul(q, k, v, mask, 0.25, None))


def test_a_lone_bf16_decode_query_takes_the_matmul_path_too():
    q, k, v, _ = make_inputs(1, 1, 300, torch.bfloat16, seed=2)
    out = attend(q, k, v, None, 0.25, None)
    assert torch.equal(out, attend_matmul(q, k, v, None, 0.25, None))
    reference = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), scale=0.25, enable_gqa=True
    )
    torch.testing.assert_close(out.double(), reference, atol=2e-2, rtol=2e-2)
    q4 = make_inputs(1, 4, 300, torch.bfloat16, seed=2)[0]  # a lone verify row of 4 keeps SDPA
    assert not torch.equal(attend(q4, k, v, None, 0.25, None), attend_matmul(q4, k, v, None, 0.25, None))


def test_softcap_bounds_the_scores():
    q, k, v, _ = make_inputs(1, 2, 8, torch.float64)
    q = q * 100  # huge scores: without the cap softmax is one-hot
    capped = attend_matmul(q, k, v, None, 1.0, 0.5)
    scores = torch.tanh((q.reshape(1, 2, 6, 16) @ k.transpose(-1, -2)) / 0.5) * 0.5
    expected = (scores.softmax(-1) @ v).reshape(1, 6, 2, 16)
    torch.testing.assert_close(capped, expected)
