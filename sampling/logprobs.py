"""Log-probabilities of emitted tokens, as the request's own sampling saw them.

For a sampled request: the log of the distribution its token was drawn from at that row, after
penalties, the grammar mask, temperature, top-k, top-p and min-p (what vLLM calls processed
log-probabilities). For a greedy request: the log-softmax of the row after penalties and the grammar
mask (temperature 0 has no distribution of its own; filters do not change an argmax).

Each emitted token -- accepted draft, recovered or bonus -- gets the target's row at its own position,
which is the row decoding without drafts would have had, so the values do not depend on the drafter.
(A recovered token is drawn from the residual max(p - q, 0), but the rule is lossless: overall it
follows p, and log p is what decoding without drafts reports.) Raw logits would be lossless too, but
the processed ones are what the request sampled from, and what a grammar-forbidden token gets (-inf).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .host_values import device_tensor
from .logits import apply_sampling_filters
from .params import SamplingParams, filter_flags

MAX_TOP_LOGPROBS = 20  #: alternatives per token at most (OpenAI's limit)


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float  #: of token_id (-inf when the row's processing excluded it)
    #: the ``logprobs`` likeliest tokens of the row, likeliest first: (id, logprob)
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class LogprobRows:
    """One request's emitted tokens in a step and where their rows are (host values)."""

    first_row: int  #: the row of its first token in the step's logits; token j comes from row first + j
    token_ids: list[int]
    params: SamplingParams


@torch.inference_mode()
def token_logprobs(logits: Tensor, requests: Sequence[LogprobRows]) -> list[list[TokenLogprob]]:
    """One entry per emitted token of each request, from ``logits`` [num_logit_rows, vocab], the step's
    processed logits (penalties and masks applied): every request's rows in one batch, read back once."""
    rows = [r.first_row + j for r in requests for j in range(len(r.token_ids))]
    tokens = [t for r in requests for t in r.token_ids]
    device = logits.device
    x = logits.index_select(0, device_tensor(rows, torch.long, device))  # [num_tokens, vocab]
    x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    row_params = [r.params for r in requests for _ in r.token_ids]
    index = [i for i, p in enumerate(row_params) if not p.is_greedy]
    if index:  # greedy rows keep their logits: temperature 0 has no distribution of its own
        sampled = [row_params[i] for i in index]
        at = device_tensor(index, torch.long, device)  # [num_sampled]
        filtered = apply_sampling_filters(
            x.index_select(0, at),
            device_tensor([p.temperature for p in sampled], torch.float32, device),
            device_tensor([p.top_k for p in sampled], torch.long, device),
            device_tensor([p.top_p for p in sampled], torch.float32, device),
            device_tensor([p.min_p for p in sampled], torch.float32, device),
            **filter_flags(sampled, x.shape[-1]),
        )  # [num_sampled, vocab] float32
        x = x.index_copy(0, at, filtered.to(x.dtype))
    logp = torch.log_softmax(x, dim=-1)  # [num_tokens, vocab]
    chosen = logp.gather(1, device_tensor(tokens, torch.long, device)[:, None])[:, 0]  # [num_tokens]
    num_top = max(r.params.logprobs or 0 for r in requests)
    values, ids = logp.topk(num_top, dim=-1)  # [num_tokens, num_top] each
    chosen_list, values_list, ids_list = chosen.tolist(), values.tolist(), ids.tolist()  # read back once
    entries, i = [], 0
    for r in requests:
        k = r.params.logprobs or 0
        entries.append(
            [
                TokenLogprob(t, chosen_list[i + j], list(zip(ids_list[i + j][:k], values_list[i + j][:k])))
                for j, t in enumerate(r.token_ids)
            ]
        )
        i += len(r.token_ids)
    return entries
