"""vLLM's ``min_tokens``: a request's stop tokens (its EOS ids unless ``ignore_eos``, and its
``stop_token_ids``) cannot be sampled before it has this many output tokens. Lossless with drafts.

Verify row j of a request holds the logits of its output token ``num_output_tokens + j``, so the rows
that come before ``min_tokens`` are exactly the ones masked: each row is what the target gives
without drafts at that position, and verification keeps greedy output identical and the sampled
distribution exact. The stop tokens' logits become -inf (a ban, not a bias: OpenAI's ``logit_bias``
stops at -100). Requests past their minimum pay nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(slots=True)
class StopMaskedRows:
    """One request's rows of a step's logits whose tokens come before its ``min_tokens`` (host values)."""

    first_row: int  #: its first row in the step's logits
    num_rows: int  #: how many of its 1 + k rows are masked
    stop_token_ids: list[int]  #: the ids its stop check ends on (checked to be in the vocabulary)


def num_rows_before_min_tokens(min_tokens: int, num_output_tokens: int, num_rows: int) -> int:
    """Of a request's ``num_rows`` rows this step, the ones whose token would be output token number
    ``num_output_tokens + j`` < ``min_tokens``."""
    return max(0, min(num_rows, min_tokens - num_output_tokens))


@torch.inference_mode()
def forbid_stop_tokens_inplace(logits: Tensor, requests: list[StopMaskedRows]) -> None:
    """logits [rows, vocab]: -inf at each request's stop tokens on its first ``num_rows`` rows."""
    rows, cols = [], []
    for r in requests:
        for row in range(r.first_row, r.first_row + r.num_rows):
            rows += [row] * len(r.stop_token_ids)
            cols += r.stop_token_ids
    if not rows:
        return
    index = torch.tensor([rows, cols], dtype=torch.long).to(logits.device, non_blocking=True)  # [2, n]
    logits[index[0], index[1]] = float("-inf")
