"""Repetition penalties on the target's logits, lossless with drafts.

Each verify row is penalized with exactly the tokens before its position: row j of a request that
carries drafts d_0..d_{k-1} sees the prompt, the output so far and d_0..d_{j-1}. Row j is then what
the target would have been given had it decoded without drafts and emitted d_0..d_{j-1} itself, so
verification keeps greedy output identical and the sampled distribution exact.

In this order, before temperature and the other filters:
1. ``repetition_penalty`` (HF's): each token in the prompt, the output or the earlier drafts has its
   logit divided by the penalty when positive, multiplied by it when negative;
2. ``frequency_penalty`` and ``presence_penalty`` (OpenAI's): minus frequency x the token's count in
   the output (and earlier drafts), minus presence once it is there at all; the prompt does not count.
A masked logit (-inf) stays -inf: a penalty never allows a token a grammar forbids.

Drafters propose from their own logits without penalties: the rule is lossless for any draft
distribution, so penalizing drafts would only change how many are accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(slots=True)
class PenalizedRows:
    """One request's rows of a step's logits, and what they are penalized with."""

    first_row: int  #: its first row in the step's logits
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]  #: the output so far (before this step's drafts)
    draft_ids: Sequence[int]  #: row j sees draft_ids[:j]; 1 + len(draft_ids) rows in all
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0


@torch.inference_mode()
def apply_penalties_inplace(logits: Tensor, requests: Sequence[PenalizedRows]) -> None:
    """Penalize each request's rows of ``logits`` [num_rows, vocab] in place."""
    for r in requests:
        num_rows = 1 + len(r.draft_ids)
        rows = logits[r.first_row : r.first_row + num_rows]  # [num_rows, vocab], a view
        counts = output_counts(
            r.output_ids, r.draft_ids, logits.shape[-1], logits.device
        )  # [num_rows, vocab]
        if r.repetition_penalty != 1:
            seen = counts > 0
            if r.prompt_ids:
                prompt = torch.as_tensor(list(r.prompt_ids), device=logits.device)
                seen[:, prompt] = True
            penalized = torch.where(rows > 0, rows / r.repetition_penalty, rows * r.repetition_penalty)
            rows.copy_(torch.where(seen, penalized, rows))
        if r.frequency_penalty or r.presence_penalty:
            counts = counts.to(rows.dtype)
            rows.sub_(r.frequency_penalty * counts + r.presence_penalty * (counts > 0).to(rows.dtype))


def output_counts(output_ids: Sequence[int], draft_ids: Sequence[int], vocab: int, device) -> Tensor:
    """[1 + len(draft_ids), vocab] int32: row j counts each token in the output and in draft_ids[:j]."""
    num_rows = 1 + len(draft_ids)
    counts = torch.zeros(num_rows, vocab, dtype=torch.int32, device=device)
    output_ids = [t for t in output_ids if 0 <= t < vocab]
    draft_ids = [t if 0 <= t < vocab else None for t in draft_ids]  # (an invalid draft counts nothing)
    if output_ids:
        ids = torch.as_tensor(list(output_ids), device=device)
        counts[0].index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
        counts[1:] = counts[0]
    if any(d is not None for d in draft_ids):
        # draft i counts in rows i + 1 .. k: one (row, token) pair each
        pairs = [(j, d) for i, d in enumerate(draft_ids) if d is not None for j in range(i + 1, num_rows)]
        row_index = torch.tensor([p[0] for p in pairs], device=device)
        token_index = torch.tensor([p[1] for p in pairs], device=device)
        counts.index_put_(
            (row_index, token_index),
            torch.ones(len(pairs), dtype=torch.int32, device=device),
            accumulate=True,
        )
    return counts
