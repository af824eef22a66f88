"""Two stages of a step on the target's logits, for the requests that ask: penalties and ``logit_bias``
before verification, and the emitted tokens' log-probabilities after it. Requests that ask for neither
pay nothing."""

from __future__ import annotations

from ...sampling.logit_bias import BiasedRows, apply_logit_bias_inplace
from ...sampling.logprobs import LogprobRows, TokenLogprob, token_logprobs
from ...sampling.penalties import PenalizedRows, PenaltyMetadata, apply_penalties_inplace
from ..model.forward_io import ForwardOutput
from .scheduler import ScheduledRequest
from .verify_stage import Faults


def has_rows(output: ForwardOutput, i: int, s: ScheduledRequest) -> bool:
    """Whether request i got its 1 + k rows (not a mid-prompt chunk, not a failed forward)."""
    num_rows = output.cu_logit_rows[i + 1] - output.cu_logit_rows[i]
    return s.completes_sequence and num_rows == 1 + len(s.draft_token_ids)


def apply_penalties_and_bias(batch: list[ScheduledRequest], output: ForwardOutput) -> None:
    """Repetition, frequency and presence penalties, each verify row with the tokens before it
    (`sampling/penalties.py`), then ``logit_bias`` (`sampling/logit_bias.py`)."""
    rows = [
        PenalizedRows(
            output.cu_logit_rows[i],
            s.request.token_ids[: s.request.num_prompt_tokens],
            s.request.token_ids[s.request.num_prompt_tokens :],
            s.draft_token_ids,
            p.repetition_penalty,
            p.frequency_penalty,
            p.presence_penalty,
        )
        for i, s in enumerate(batch)
        if (p := s.request.sampling_params).has_penalties and has_rows(output, i, s)
    ]
    if rows:
        meta = PenaltyMetadata.build(rows, output.logits.shape[-1], output.logits.device)
        apply_penalties_inplace(output.logits, meta)
    biased = [
        BiasedRows(output.cu_logit_rows[i], 1 + len(s.draft_token_ids), s.request.sampling_params.logit_bias)
        for i, s in enumerate(batch)
        if s.request.sampling_params.logit_bias and has_rows(output, i, s)
    ]
    if biased:
        apply_logit_bias_inplace(output.logits, biased)


def emitted_logprobs(
    batch: list[ScheduledRequest], output: ForwardOutput, verifications, faults: Faults
) -> list[list[TokenLogprob] | None]:
    """Log-probabilities of the emitted tokens of the requests that ask (`sampling/logprobs.py`), all in
    one batch; if that raises, one request at a time, and a request whose own fails fails alone."""
    asking = {
        i: LogprobRows(output.cu_logit_rows[i], list(v.token_ids), s.request.sampling_params)
        for i, (s, v) in enumerate(zip(batch, verifications))
        if v is not None and s.request not in faults and s.request.sampling_params.logprobs is not None
    }
    logprobs: list[list[TokenLogprob] | None] = [None] * len(batch)
    if not asking:
        return logprobs
    try:
        for i, entries in zip(asking, token_logprobs(output.logits, list(asking.values()))):
            logprobs[i] = entries
    except Exception:
        for i, rows in asking.items():
            try:
                logprobs[i] = token_logprobs(output.logits, [rows])[0]
            except Exception as exc:
                faults[batch[i].request] = f"log-probabilities failed: {type(exc).__name__}: {exc}"
    return logprobs
