"""OpenAI's ``logit_bias``: a fixed number added to chosen tokens' logits, lossless with drafts.

The bias does not depend on the position, so every row of a request (its decode row, or each verify
row of its drafts) gets the same addition: the rows are then exactly what the target would have given
without drafts, and verification keeps greedy output identical and the sampled distribution exact. A
masked logit (-inf) stays -inf. Requests without a bias pay nothing; a step with some builds its row and
column indices on the host and applies them in one indexed add.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(slots=True)
class BiasedRows:
    """One request's rows of a step's logits and its bias (host values)."""

    first_row: int  #: its first row in the step's logits
    num_rows: int  #: 1 + its drafts
    bias: dict[int, float]  #: token id -> the number added (ids already checked to be in the vocabulary)


@torch.inference_mode()
def apply_logit_bias_inplace(logits: Tensor, requests: list[BiasedRows]) -> None:
    """logits [rows, vocab]: add each request's bias to each of its rows."""
    rows, cols, values = [], [], []
    for r in requests:
        ids, adds = list(r.bias), list(r.bias.values())
        for row in range(r.first_row, r.first_row + r.num_rows):
            rows += [row] * len(ids)
            cols += ids
            values += adds
    if not rows:
        return
    index = torch.tensor([rows, cols], dtype=torch.long).to(logits.device, non_blocking=True)  # [2, n]
    add = torch.tensor(values, dtype=torch.float64).to(logits.device, non_blocking=True)  # [n]
    logits.index_put_((index[0], index[1]), add.to(logits.dtype), accumulate=True)
