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

from .host_values import device_tensor
from .logprobs import TokenLogprob


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
    tokens = [t for r in requests for t in r.next_token_ids]
    device = logits.device
    x = logits.index_select(0, device_tensor(rows, torch.long, device))  # [num_rows, vocab]
    x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    logp = torch.log_softmax(x, dim=-1)  # [num_rows, vocab]
    chosen = logp.gather(1, device_tensor(tokens, torch.long, device)[:, None])[:, 0]  # [num_rows]
    k = max(r.num_top for r in requests)
    top_values, top_ids = logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long())  # [num_rows, k]
    chosen, top_values, top_ids = chosen.tolist(), top_values.tolist(), top_ids.tolist()
    out, at = [], 0
    for r in requests:
        entries = []
        for j, token in enumerate(r.next_token_ids):
            top = list(zip(top_ids[at + j][: r.num_top], top_values[at + j][: r.num_top]))
            entries.append(TokenLogprob(token, chosen[at + j], top))
        out.append(entries)
        at += len(r.next_token_ids)
    return out
