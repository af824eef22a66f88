"""The attention kernels a paged attention call can run on one padded group: SDPA, or two matmuls
accumulated in float32. Which one runs for decode and verify rows is measured per machine (`attention_paths.py`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOW_PRECISION = (torch.bfloat16, torch.float16)
#: queries per request up to which the unmeasured default may take the matmul path for bf16 on CPU
MAX_MATMUL_QUERY_LEN = 64
SDPA, MATMUL, AUTO = "sdpa", "matmul", "auto"
#: the C++ CPU kernel over the pages themselves (`paged_attention_cpu.py`): no gather; short queries only
PAGED_CPU = "paged_cpu"
#: the Triton CUDA kernel over the pages themselves (`triton_kernels/paged_attention.py`): likewise
PAGED_TRITON = "paged_triton"


def attend(
    query: torch.Tensor,  # [group, heads, max_q, head_dim]
    key: torch.Tensor,  # [group, kv_heads, max_kv, head_dim]
    value: torch.Tensor,  # [group, kv_heads, max_kv, head_dim]
    mask: torch.Tensor | None,  # [group, 1, max_q, max_kv]
    scaling: float,
    softcap: float | None,
    path: str = AUTO,
) -> torch.Tensor:  # [group, heads, max_q, head_dim]
    """Attention by ``path``: SDPA, the float32 matmuls, or (``auto``, when nothing was measured) the
    matmuls for low-precision short queries on CPU, where SDPA's bf16 kernel is slow (one query over 1.3k
    keys: 0.81 ms vs 0.20 ms), else SDPA. Softcapping always takes the matmuls (SDPA has none)."""
    if path == AUTO:
        path = MATMUL if _matmul_by_default(query) else SDPA
    if softcap is None and path == SDPA:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scaling, enable_gqa=True
        )
    return attend_matmul(query, key, value, mask, scaling, softcap)


def _matmul_by_default(query: torch.Tensor) -> bool:
    return (
        query.device.type == "cpu"
        and query.dtype in LOW_PRECISION
        and ((query.shape[0] > 1 and query.shape[2] <= MAX_MATMUL_QUERY_LEN) or query.shape[2] == 1)
    )


def attend_matmul(query, key, value, mask, scaling: float, softcap: float | None) -> torch.Tensor:
    """Attention as two matmuls accumulated in float32 (float64 stays float64), the query heads of
    each KV head stacked as rows (no K/V repeat); does softcapping."""
    num, heads, max_q, head_dim = query.shape
    kv_heads = key.shape[1]
    rep = heads // kv_heads
    acc = torch.float32 if query.dtype in LOW_PRECISION else query.dtype
    q = query.reshape(num, kv_heads, rep * max_q, head_dim).to(acc)  # [group, kv_heads, rep*max_q, head_dim]
    # gathered pages come as a strided view ([group, max_kv, kv_heads, d] transposed), and batched bf16
    # matmuls over its float32 copy ran slowly: 8 decode rows over 2k keys took 24 ms per layer call in
    # corpus generation, 12 ms with contiguous copies (AVX512-BF16 EPYC); float32 is unchanged
    key = key.to(acc, memory_format=torch.contiguous_format)  # [group, kv_heads, max_kv, head_dim]
    value = value.to(acc, memory_format=torch.contiguous_format)
    scores = (q @ key.transpose(-1, -2)) * scaling  # [group, kv_heads, rep*max_q, max_kv]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        # [group, 1, max_q, max_kv] -> [group, 1, rep*max_q, max_kv]: every stacked head sees its query's row
        stacked = (
            mask.unsqueeze(2).expand(num, 1, rep, max_q, mask.shape[-1]).reshape(num, 1, rep * max_q, -1)
        )
        scores = scores.masked_fill(~stacked, float("-inf"))
    probs = scores.softmax(-1)  # accumulate in float32 at least, as SDPA does
    return (probs @ value).to(query.dtype).reshape(num, heads, max_q, head_dim)
