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
A masked logit (-inf) stays -inf: a penalty never allows a token a grammar forbids (and the executor
applies grammar masks after the penalties anyway).

One step's penalized rows are handled together: the token counts of every request are built on the
device by one scatter over the flattened token history, each row takes its request's counts plus the
drafts before it, and the penalties are a handful of [rows, vocab] tensor ops. Requests without
penalties are left out of all of it.

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
    """One request's rows of a step's logits, and what they are penalized with (host values)."""

    first_row: int  #: its first row in the step's logits
    prompt_ids: Sequence[int]  #: (ids already checked to be in the vocabulary)
    output_ids: Sequence[int]  #: the output so far (before this step's drafts)
    draft_ids: Sequence[int]  #: row j sees draft_ids[:j]; 1 + len(draft_ids) rows in all
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0


@dataclass(slots=True)
class PenaltyMetadata:
    """One step's penalized rows, flattened: ``num_rows`` rows of ``num_requests`` requests, request
    after request (the ``cu_*`` host offsets say where each request's part of each tensor starts)."""

    rows: Tensor  # [num_rows] long, each penalized row's index in the step's logits
    row_request: Tensor  # [num_rows] long, the request (0..num_requests-1) owning each row
    history_ids: Tensor  # [num_history] long, every request's output tokens
    prompt_ids: Tensor  # [num_prompt] long, the prompts of requests with a repetition penalty
    draft_row: Tensor  # [num_pairs] long, (row, draft) pairs: a draft counts in each later row of its
    draft_ids: Tensor  # [num_pairs] long    request (k(k+1)/2 pairs for k drafts)
    penalties: Tensor  # [3, num_rows] float64: repetition, frequency, presence of each row
    cu_rows: list[int]  # [num_requests + 1]
    cu_history: list[int]  # [num_requests + 1]
    cu_prompt: list[int]  # [num_requests + 1]
    cu_pairs: list[int]  # [num_requests + 1]
    has_repetition: list[bool]  # [num_requests] repetition_penalty != 1
    has_additive: list[bool]  # [num_requests] a frequency or presence penalty

    @property
    def num_requests(self) -> int:
        return len(self.has_repetition)

    @classmethod
    def build(cls, requests: Sequence[PenalizedRows], vocab: int, device) -> PenaltyMetadata:
        """From each request's host values, in one copy of integers to the device (drafts outside
        the vocabulary count nothing)."""
        longs: list[list[int]] = [[] for _ in range(6)]
        rows, row_request, history, prompt, draft_row, draft_ids = longs
        cu: list[list[int]] = [[0], [0], [0], [0]]
        penalties: list[tuple[float, float, float]] = []
        for n, r in enumerate(requests):
            num_rows, first = 1 + len(r.draft_ids), len(rows)
            rows.extend(range(r.first_row, r.first_row + num_rows))
            row_request.extend([n] * num_rows)
            history.extend(r.output_ids)
            if r.repetition_penalty != 1:
                prompt.extend(r.prompt_ids)
            for i, d in enumerate(r.draft_ids):
                if 0 <= d < vocab:
                    draft_row.extend(range(first + i + 1, first + num_rows))
                    draft_ids.extend([d] * (num_rows - i - 1))
            for offsets, part in zip(cu, (rows, history, prompt, draft_row)):
                offsets.append(len(part))
            penalties.extend([(r.repetition_penalty, r.frequency_penalty, r.presence_penalty)] * num_rows)
        host = torch.tensor([t for part in longs for t in part], dtype=torch.long)
        parts = host.to(device, non_blocking=True).split([len(part) for part in longs])
        values = torch.tensor(penalties, dtype=torch.float64).T.to(device, non_blocking=True)
        return cls(
            rows=parts[0],
            row_request=parts[1],
            history_ids=parts[2],
            prompt_ids=parts[3],
            draft_row=parts[4],
            draft_ids=parts[5],
            penalties=values,
            cu_rows=cu[0],
            cu_history=cu[1],
            cu_prompt=cu[2],
            cu_pairs=cu[3],
            has_repetition=[r.repetition_penalty != 1 for r in requests],
            has_additive=[r.frequency_penalty != 0 or r.presence_penalty != 0 for r in requests],
        )

    def chunks(self, max_rows: int) -> list[tuple[int, int]]:
        """Runs of whole requests [a, b) of at most ``max_rows`` rows each (one request may exceed it)."""
        bounds, a = [], 0
        for b in range(1, self.num_requests + 1):
            if b == self.num_requests or self.cu_rows[b + 1] - self.cu_rows[a] > max_rows:
                bounds.append((a, b))
                a = b
        return bounds


#: On the CPU a step's rows are penalized a few at a time, so that the handful of passes over them
#: stays in the cache (one pass over every row at once is several times slower there); on a GPU all
#: rows go in one go.
CPU_CHUNK_ELEMENTS = 1 << 18


@torch.inference_mode()
def apply_penalties_inplace(logits: Tensor, meta: PenaltyMetadata) -> None:
    """Penalize the rows ``meta.rows`` of ``logits`` [num_logit_rows, vocab] in place (in float64 for
    float64 logits, float32 otherwise)."""
    vocab = logits.shape[-1]
    max_rows = meta.cu_rows[-1] if logits.is_cuda else max(1, CPU_CHUNK_ELEMENTS // vocab)
    for a, b in meta.chunks(max_rows):
        _penalize_requests_inplace(logits, meta, a, b)


def _penalize_requests_inplace(logits: Tensor, meta: PenaltyMetadata, a: int, b: int) -> None:
    """Requests a..b-1 of ``meta``: their rows, counts and penalties as [rows, vocab] tensor ops."""
    vocab = logits.shape[-1]
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    first, last = meta.cu_rows[a], meta.cu_rows[b]
    rows = meta.rows[first:last]  # [num_rows]
    row_request = meta.row_request[first:last] - a  # [num_rows]
    x = logits.index_select(0, rows).to(dtype)  # [num_rows, vocab]
    counts = count_tokens(meta, a, b, vocab)  # [num_rows, vocab]
    rep, freq, pres = meta.penalties[:, first:last, None].to(dtype)  # [num_rows, 1] each
    if any(meta.has_repetition[a:b]):
        prompt = meta.prompt_ids[meta.cu_prompt[a] : meta.cu_prompt[b]]
        prompt_request = _request_of(meta.cu_prompt, a, b, prompt.device)
        in_prompt = _scatter_counts(b - a, vocab, prompt_request, prompt) > 0  # [b - a, vocab]
        seen = in_prompt.index_select(0, row_request) | (counts > 0)  # [num_rows, vocab]
        x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)  # (rep 1 leaves a row as it is)
    if any(meta.has_additive[a:b]):
        x = x - (freq * counts.to(dtype) + pres * (counts > 0).to(dtype))
    logits.index_copy_(0, rows, x.to(logits.dtype))


def count_tokens(meta: PenaltyMetadata, a: int, b: int, vocab: int) -> Tensor:
    """[num_rows, vocab] int32 for the rows of requests a..b-1: row j of a request counts each token in
    its output and in its drafts before row j."""
    first = meta.cu_rows[a]
    history = meta.history_ids[meta.cu_history[a] : meta.cu_history[b]]
    counts = _scatter_counts(b - a, vocab, _request_of(meta.cu_history, a, b, history.device), history)
    rows = counts.index_select(0, meta.row_request[first : meta.cu_rows[b]] - a)  # [num_rows, vocab]
    pairs = slice(meta.cu_pairs[a], meta.cu_pairs[b])
    flat = (meta.draft_row[pairs] - first) * vocab + meta.draft_ids[pairs]  # [num_pairs]
    rows.view(-1).index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return rows


def _request_of(cu: list[int], a: int, b: int, device) -> Tensor:
    """[cu[b] - cu[a]] long: which of requests a..b-1 (counted from 0) owns each entry."""
    sizes = torch.tensor([cu[n + 1] - cu[n] for n in range(a, b)])
    return torch.repeat_interleave(torch.arange(b - a), sizes).to(device, non_blocking=True)


def _scatter_counts(num_requests: int, vocab: int, request: Tensor, ids: Tensor) -> Tensor:
    """[num_requests, vocab] int32: how often each request's ``ids`` hold each token."""
    counts = torch.zeros(num_requests * vocab, dtype=torch.int32, device=ids.device)
    counts.index_add_(0, request * vocab + ids, torch.ones_like(ids, dtype=torch.int32))
    return counts.view(num_requests, vocab)
