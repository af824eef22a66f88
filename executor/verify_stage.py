"""Verification inside the loop, fault by fault: which rows of a step's logits can be trusted, one
batched `RejectionSampler` call (one request at a time if it raises), and a check of every answer.

A row whose logits hold NaN or +inf, or allow no token at all (a grammar with no way on), is *bad* and
is never read: a request's drafts are cut so that verification stops before its first bad row, and a
request whose very next token would come from a bad row fails. (Greedy output is the same as without
drafts: the tokens before the bad row are emitted, then the request fails where it would have.) A
request whose own verification raises, or answers something impossible, fails alone.
"""

from __future__ import annotations

import math

import torch

from ..sampling.rejection import RejectionSampler, Verification
from .model_runner import ForwardOutput
from .request import RequestState
from .scheduler import ScheduledRequest

Faults = dict[RequestState, str]  # requests that failed in this step -> why


class VerifyStage:
    def __init__(self, sampler: RejectionSampler, vocab_size: int) -> None:
        self.sampler = sampler
        self.vocab_size = vocab_size

    def verify(
        self, batch: list[ScheduledRequest], output: ForwardOutput, masks, faults: Faults
    ) -> list[Verification | None]:
        """Verify each producing request's drafts (none: just sample), never reading a bad row: a request
        whose first row is bad fails; one with a bad row j > 0 keeps its first j - 1 drafts, so rows
        0..j-1 verify them (the row that proposed draft j - 1 gives the next token instead)."""
        verifications: list[Verification | None] = [None] * len(batch)
        row_max = output.logits.amax(dim=-1).tolist()  # [num_rows]: one pass, one host sync
        items = []  # (batch index, its first row)
        for i, s in enumerate(batch):
            r = s.request
            if not s.completes_sequence or r in faults:
                continue
            start = output.cu_logit_rows[i]
            num_rows = len(r.draft_token_ids) + 1
            bad = next((j for j in range(num_rows) if not math.isfinite(row_max[start + j])), None)
            if bad == 0:
                faults[r] = self._bad_row_message(row_max[start], masks, start)
                continue
            if bad is not None:
                r.draft_token_ids = r.draft_token_ids[: bad - 1]
                r.draft_probs = r.draft_probs[: bad - 1] if r.draft_probs is not None else None
            items.append((i, start))
        requests = [batch[i].request for i, _ in items]
        for (i, _), v in zip(items, self._verify(requests, output.logits, [st for _, st in items], faults)):
            verifications[i] = v
        return verifications

    def _verify(
        self, requests: list[RequestState], logits: torch.Tensor, starts: list[int], faults: Faults
    ) -> list[Verification | None]:
        """One batched verification; if it raises, one request at a time. A request whose own
        verification raises or answers something impossible fails."""
        if not requests:
            return []
        index = [start + j for r, start in zip(requests, starts) for j in range(len(r.draft_token_ids) + 1)]
        contiguous = index == list(range(index[0], index[0] + len(index)))
        rows = (
            logits[index[0] : index[0] + len(index)] if contiguous else logits[index]
        )  # [num_used_rows, vocab]
        cu = [0]
        for r in requests:
            cu.append(cu[-1] + len(r.draft_token_ids) + 1)
        try:
            results: list[Verification | None] = list(
                self.sampler.verify_batch(
                    rows,
                    cu,
                    [r.draft_token_ids for r in requests],
                    [r.draft_probs for r in requests],
                    [r.sampling_params for r in requests],
                    [r.generator for r in requests],
                )
            )
        except Exception:
            results = [self._verify_one(r, rows[cu[k] : cu[k + 1]], faults) for k, r in enumerate(requests)]
        for k, (r, v) in enumerate(zip(requests, results)):
            problem = None if v is None else self._impossible(v, r)
            if problem is not None:
                faults[r], results[k] = f"verification returned {problem}", None
        return results

    def _verify_one(self, r: RequestState, rows: torch.Tensor, faults: Faults) -> Verification | None:
        try:
            return self.sampler.verify(rows, r.draft_token_ids, r.draft_probs, r.sampling_params, r.generator)
        except Exception as exc:
            faults[r] = f"sampling failed: {type(exc).__name__}: {exc}"
            return None

    def _impossible(self, v, r: RequestState) -> str | None:
        """What is wrong with a verification, or None: accepted drafts, then one token in the vocabulary."""
        drafts = r.draft_token_ids
        if not isinstance(v, Verification) or not isinstance(v.num_accepted, int):
            return f"{type(v).__name__}, not a Verification"
        if not 0 <= v.num_accepted <= len(drafts) or len(v.token_ids) != v.num_accepted + 1:
            return f"{v.num_accepted} accepted of {len(drafts)} drafts with {len(v.token_ids)} tokens"
        if list(v.token_ids[: v.num_accepted]) != drafts[: v.num_accepted]:
            return "accepted tokens that are not the drafts"
        last = v.token_ids[-1]
        if isinstance(last, bool) or not isinstance(last, int) or not 0 <= last < self.vocab_size:
            return f"token {last!r}, outside the vocabulary"
        return None

    def _bad_row_message(self, value: float, masks, row: int) -> str:
        """Why a request's next token cannot be drawn from this row of logits (its row max is ``value``)."""
        if math.isnan(value):
            return "the model's logits hold NaN for its next token"
        if value > 0:
            return "the model's logits hold +inf for its next token"
        if masks is not None and int(masks.needs_mask[row]):
            return "the grammar admits no token next: the schema, regex or grammar has no valid continuation"
        return "every logit is -inf for its next token"
