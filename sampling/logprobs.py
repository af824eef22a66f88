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
    device = logits.device
    x = rows_to_score(logits, rows)  # [num_tokens, vocab]
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
    return read_entries(logp, [r.token_ids for r in requests], [r.params.logprobs or 0 for r in requests])


def rows_to_score(logits: Tensor, rows: list[int]) -> Tensor:
    """logits [num_logit_rows, vocab] -> the ``rows`` [len(rows), vocab], 16-bit rows in float32."""
    x = logits.index_select(0, device_tensor(rows, torch.long, logits.device))
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def read_entries(
    logp: Tensor,  # [num_tokens, vocab] log-probabilities, request after request
    token_ids: Sequence[Sequence[int]],  # each request's tokens, one per row
    num_top: Sequence[int],  # each request's likeliest alternatives per token
) -> list[list[TokenLogprob]]:
    """Each request's entries: its tokens' log-probabilities and top alternatives, read back once."""
    tokens = [t for ids in token_ids for t in ids]
    chosen = logp.gather(1, device_tensor(tokens, torch.long, logp.device)[:, None])[:, 0]  # [num_tokens]
    values, ids = logp.topk(max(num_top, default=0), dim=-1)  # [num_tokens, max top] each
    chosen_list, values_list, ids_list = chosen.tolist(), values.tolist(), ids.tolist()  # read back once
    entries, i = [], 0
    for request_ids, k in zip(token_ids, num_top):
        entries.append(
            [
                TokenLogprob(t, chosen_list[i + j], list(zip(ids_list[i + j][:k], values_list[i + j][:k])))
                for j, t in enumerate(request_ids)
            ]
        )
        i += len(request_ids)
    return entries
