"""Log-probabilities of a request's prompt tokens (``SamplingParams.prompt_logprobs``; OpenAI's
``echo`` with ``logprobs``, which lm-evaluation-harness's log-likelihood tasks read).

The prefill's row at position p scores the prompt token at p + 1. These are the model's own
log-softmax of the raw logits (float32 for 16-bit models): no penalty, grammar or temperature touches
a prompt, and an HF forward's ``log_softmax(logits)`` gives the same numbers. The first prompt token
has no row before it, so it has no entry (None). A chunked prefill yields its entries chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .logprobs import TokenLogprob, read_entries, rows_to_score


@dataclass(slots=True)
class PromptRows:
    """One request's prompt rows in a step's logits (host values)."""

    first_row: int  #: the row scoring ``next_token_ids[0]``; row first + j scores next_token_ids[j]
    next_token_ids: list[int]  #: the prompt tokens these rows score
    num_top: int  #: likeliest alternatives per token (0: the token's own log-probability only)


@torch.inference_mode()
def prompt_logprobs(logits: Tensor, requests: Sequence[PromptRows]) -> list[list[TokenLogprob]]:
    """One entry per scored prompt token of each request, from ``logits`` [num_logit_rows, vocab]: every
    request's rows in one batch, read back once."""
    rows = [r.first_row + j for r in requests for j in range(len(r.next_token_ids))]
    if not rows:
        return [[] for _ in requests]
    logp = torch.log_softmax(rows_to_score(logits, rows), dim=-1)  # [num_rows, vocab]
    return read_entries(logp, [r.next_token_ids for r in requests], [r.num_top for r in requests])
