"""Each logit row's status and argmax for verification on CUDA, one launch (`../row_summary.py`).

torch's version (`sampling.rejection.row_summary`) is a max and a status built from isfinite, isnan, a
compare and three wheres, then a stack: about ten launches after every replayed forward, on the step's
critical path (the host launches them while the GPU waits for the answer). One program a row reads the
row once: each lane keeps its running max and the first index of it, NaN is noted, then the lanes
agree on the max and the smallest index holding it (torch's first index of the max).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048  #: columns a program reads per iteration
NO_INDEX = 2**31 - 1


@triton.jit
def _row_status_argmax_kernel(x_ptr, out_ptr, vocab, stride, BLOCK: tl.constexpr, NO_INDEX: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    best = tl.full((BLOCK,), float("-inf"), tl.float32)  # each lane's running max
    best_at = tl.full((BLOCK,), NO_INDEX, tl.int32)  # and the first column holding it
    has_nan = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, vocab, BLOCK):
        cols = start + lanes
        valid = cols < vocab
        v = tl.load(x_ptr + row * stride + cols, mask=valid, other=float("-inf")).to(tl.float32)
        has_nan |= (v != v).to(tl.int32)
        better = valid & ((v > best) | (best_at == NO_INDEX))  # a lane's first column sets it
        best = tl.where(better, v, best)
        best_at = tl.where(better, cols, best_at)
    row_max = tl.max(best, axis=0)
    argmax = tl.min(tl.where(best == row_max, best_at, NO_INDEX), axis=0)
    nan = tl.max(has_nan, axis=0)
    status = tl.where(
        nan > 0, 1, tl.where(row_max == float("inf"), 2, tl.where(row_max == float("-inf"), 3, 0))
    )
    tl.store(out_ptr + row * 2, status.to(tl.int64))
    tl.store(out_ptr + row * 2 + 1, argmax.to(tl.int64))


def row_status_argmax(logits: torch.Tensor) -> torch.Tensor:  # [rows, vocab] -> [rows, 2] long
    """(status, argmax) of each row (`sampling.rejection.ROW_STATUS`'s codes), as torch's max gives."""
    rows, vocab = logits.shape
    out = torch.empty(rows, 2, dtype=torch.long, device=logits.device)
    if rows:
        if logits.stride(1) != 1:
            logits = logits.contiguous()
        _row_status_argmax_kernel[(rows,)](
            logits, out, vocab, logits.stride(0), BLOCK=BLOCK, NO_INDEX=NO_INDEX, num_warps=8
        )
    return out
