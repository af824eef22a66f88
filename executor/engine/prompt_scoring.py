"""Scoring the prompt inside the prefill (``SamplingParams.prompt_logprobs``): which rows a chunk adds,
and taking them back out of the forward's output.

A request that asks gets, besides its own rows (the last token's, and its drafts'), a row for each
prompt position p of the chunk whose next token p + 1 is still a prompt token and not scored yet. Those
rows end where its own rows begin, so a request's rows are still the last of its tokens (the layout
every forward path reads). After the forward they are scored (`sampling/prompt_logprobs.py`) and
removed, so every later stage sees the rows it always saw.
"""

from __future__ import annotations

import torch

from ...sampling.prompt_logprobs import PromptRows, prompt_logprobs
from ..model.forward_io import ForwardOutput
from .scheduler import ScheduledRequest
from .verify_stage import Faults


def prompt_rows_of(s: ScheduledRequest) -> tuple[int, int]:
    """(first position, count) of the rows scoring prompt tokens this chunk computes for a request that
    asks ``prompt_logprobs``: position p scores prompt token p + 1. A recompute after preemption scores
    only what was not scored yet."""
    r = s.request
    if not r.prompt_logprobs:  # (not asked: empty; asked: [None, ...])
        return 0, 0
    start = r.num_computed_tokens
    first = max(start, len(r.prompt_logprobs) - 1)
    end = min(start + s.num_new_tokens, r.num_prompt_tokens - 1)
    return first, max(0, end - first)


def take_prompt_logprobs(
    batch: list[ScheduledRequest],
    output: ForwardOutput,
    prompt_rows: list[tuple[int, int]],
    faults: Faults,
) -> ForwardOutput:
    """Score the prompt rows, append the entries to their requests, and return the output without those
    rows. If scoring raises, the asking requests fail alone."""
    asking = {}
    for i, (s, (first, count)) in enumerate(zip(batch, prompt_rows)):
        if count and output.cu_logit_rows[i + 1] - output.cu_logit_rows[i] >= count:  # (its forward ran)
            r = s.request
            top = r.sampling_params.prompt_logprobs
            asking[i] = PromptRows(output.cu_logit_rows[i], r.token_ids[first + 1 : first + 1 + count], top)
    try:
        for i, entries in zip(asking, prompt_logprobs(output.logits, list(asking.values()))):
            batch[i].request.prompt_logprobs.extend(entries)
    except Exception as exc:
        for i in asking:
            faults[batch[i].request] = f"prompt log-probabilities failed: {type(exc).__name__}: {exc}"
    keep, cu_rows = [], [0]  # each request's own rows
    for i, (_, count) in enumerate(prompt_rows):
        lo, hi = output.cu_logit_rows[i], output.cu_logit_rows[i + 1]
        lo = min(hi, lo + count)
        keep.extend(range(lo, hi))
        cu_rows.append(cu_rows[-1] + hi - lo)
    index = torch.tensor(keep, dtype=torch.long).to(output.logits.device)  # [num_own_rows]
    return ForwardOutput(
        output.logits.index_select(0, index), cu_rows, output.hidden_states, output.cu_tokens
    )
