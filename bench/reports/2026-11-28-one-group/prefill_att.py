"""One layer's causal attention over a fresh prompt (SmolLM2's heads): the C++ paged kernel against
torch's SDPA, at 67, 364 and 779 queries, bfloat16 and float32.

    python prefill_att.py
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from specexec.executor.layers.paged_attention_cpu import attend_paged_cpu


def ms(fn, repeats: int = 5) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


block = 16
for length in (67, 364, 779):
    for dtype in (torch.bfloat16, torch.float32):
        num_blocks = -(-length // block)
        pool = torch.randn(2, (num_blocks + 1) * block, 3, 64).to(dtype)
        tables = torch.arange(num_blocks).view(1, -1)
        q = torch.randn(1, length, 9, 64).to(dtype)  # [1, queries, heads, head_dim]
        args = (q, pool, tables, torch.arange(length).view(1, -1), torch.tensor([length]), block, 0.125)
        paged = ms(lambda args=args: attend_paged_cpu(*args, None, None))
        k, v = pool[0, :length].transpose(0, 1)[None], pool[1, :length].transpose(0, 1)[None]
        qt = q.transpose(1, 2)
        sdpa = ms(
            lambda qt=qt, k=k, v=v: F.scaled_dot_product_attention(
                qt, k, v, is_causal=True, enable_gqa=True, scale=0.125
            )
        )
        print(f"{length} {dtype}: C++ paged {paged:.2f} ms, SDPA causal {sdpa:.2f} ms")
