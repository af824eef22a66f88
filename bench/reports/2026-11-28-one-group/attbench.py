"""The C++ paged attention kernel alone, warm: 8 decode rows at Spec-Bench-like key lengths on shuffled
pages, SmolLM2's heads, bfloat16.

    python attbench.py
"""

from __future__ import annotations

import time

import torch
from specexec.executor.layers.paged_attention_cpu import attend_paged_cpu

lens = [60, 45, 80, 75, 60, 50, 380, 800]
block = 16
blocks = [-(-n // block) for n in lens]
num_blocks = sum(blocks) + 1
pool = torch.randn(2, num_blocks * block, 3, 64).to(torch.bfloat16)
pages = torch.randperm(num_blocks - 1).tolist()
tables = torch.zeros(len(lens), max(blocks), dtype=torch.long)
first = 0
for g, count in enumerate(blocks):
    tables[g, :count] = torch.tensor(pages[first : first + count])
    first += count
q = torch.randn(len(lens), 1, 9, 64).to(torch.bfloat16)
args = (q, pool, tables, torch.tensor(lens).view(-1, 1) - 1, torch.tensor(lens), block, 0.125, None, None)
for _ in range(20):
    attend_paged_cpu(*args)
calls = 500
start = time.perf_counter()
for _ in range(calls):
    attend_paged_cpu(*args)
print(f"{(time.perf_counter() - start) / calls * 1e6:.1f} us per call (8 requests, warm)")
