"""Each logit row's status and argmax for verification (`sampling.rejection.RowSummary`): the C++ op
``row_status_argmax`` (`row_summary_cpu.cpp`) for CPU rows in float32, bfloat16 or float16, its Triton
kernel (`triton_kernels/row_summary.py`) for CUDA rows in those dtypes, torch's max otherwise (float64,
or where neither builds). A batch-1 GGUF decode step spent about 130 us in torch's max and status ops
over the 49,152-entry bfloat16 row; the C++ op takes a few. On CUDA torch's version is about ten
launches after each replayed forward, one kernel here."""

from __future__ import annotations

import torch

from ...sampling.rejection import row_summary as torch_row_summary
from .cpu_kernels import cpu_kernels, fused_ops_take
from .triton_kernels import triton_ops_take


def row_summary(logits: torch.Tensor) -> torch.Tensor:  # [rows, vocab] -> [rows, 2] long
    """(status, argmax) of each row, as `sampling.rejection.row_summary` gives them."""
    if logits.dim() == 2 and logits.shape[1] > 0 and fused_ops_take(logits):
        return cpu_kernels().row_status_argmax(logits)
    if logits.dim() == 2 and logits.shape[1] > 0 and triton_ops_take(logits):
        from .triton_kernels.row_summary import row_status_argmax

        return row_status_argmax(logits)
    return torch_row_summary(logits)
