"""Log-probabilities of emitted tokens, as the request's own sampling saw them.

For a sampled request: the log of the distribution its token was drawn from at that row, after
penalties, the grammar mask, temperature, top-k, top-p and min-p (what vLLM calls processed
log-probabilities). For a greedy request: the log-softmax of the row after penalties and the grammar
mask (temperature 0 has no distribution of its own; filters do not change an argmax). Each emitted
token -- accepted draft, recovered or bonus -- gets the target's row at its own position, which is the
row decoding without drafts would have had: the values do not depend on the drafter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .logits import apply_sampling_filters
from .params import SamplingParams, filter_flags

MAX_TOP_LOGPROBS = 20  #: alternatives per token at most (OpenAI's limit)


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float  #: of token_id (-inf when the row's processing excluded it)
    #: the ``logprobs`` likeliest tokens of the row, likeliest first: (id, logprob)
    top: list[tuple[int, float]] = field(default_factory=list)


@torch.inference_mode()
def token_logprobs(rows: Tensor, token_ids: list[int], params: SamplingParams) -> list[TokenLogprob]:
    """One entry per emitted token: ``rows`` [len(token_ids), vocab] are the processed logits (penalties
    and masks applied) at the positions that produced them."""
    num_top = params.logprobs or 0
    logits = rows.float() if rows.dtype in (torch.float16, torch.bfloat16) else rows
    if not params.is_greedy:
        n = len(token_ids)
        logits = apply_sampling_filters(
            logits,
            torch.full((n,), float(params.temperature)),
            torch.full((n,), params.top_k, dtype=torch.long),
            torch.full((n,), float(params.top_p)),
            torch.full((n,), float(params.min_p)),
            **filter_flags([params], logits.shape[-1]),
        )
    logp = torch.log_softmax(logits, dim=-1)  # [n, vocab]
    chosen = logp.gather(1, torch.tensor(token_ids, device=logp.device)[:, None])[:, 0]  # [n]
    values, ids = logp.topk(num_top, dim=-1) if num_top else (logp[:, :0], logp[:, :0].long())
    chosen, values, ids = chosen.tolist(), values.tolist(), ids.tolist()  # one read back
    return [TokenLogprob(t, c, list(zip(i, v))) for t, c, i, v in zip(token_ids, chosen, ids, values)]
