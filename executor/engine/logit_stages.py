"""Stages of a step on the target's logits, for the requests that ask: penalties, ``logit_bias`` and
``min_tokens`` before verification, and the emitted tokens' log-probabilities after it. Requests that
ask for none pay nothing."""

from __future__ import annotations

from ...sampling.logit_bias import BiasedRows, apply_logit_bias_inplace
from ...sampling.logprobs import LogprobRows, TokenLogprob, token_logprobs
from ...sampling.min_tokens import StopMaskedRows, forbid_stop_tokens_inplace, num_rows_before_min_tokens
from ...sampling.penalties import PenalizedRows, PenaltyMetadata, apply_penalties_inplace
from ..model.forward_io import ForwardOutput
from .scheduler import ScheduledRequest
from .verify_stage import Faults


def has_rows(output: ForwardOutput, i: int, s: ScheduledRequest) -> bool:
    """Whether request i got its 1 + k rows (not a mid-prompt chunk, not a failed forward)."""
    num_rows = output.cu_logit_rows[i + 1] - output.cu_logit_rows[i]
    return s.completes_sequence and num_rows == 1 + len(s.draft_token_ids)


def apply_penalties_and_bias(
    batch: list[ScheduledRequest], output: ForwardOutput, eos_token_ids: frozenset[int] = frozenset()
) -> None:
    """Repetition, frequency and presence penalties, each verify row with the tokens before it
    (`sampling/penalties.py`), then ``logit_bias`` (`sampling/logit_bias.py`), then the stop tokens
    banned on the rows before a request's ``min_tokens`` (`sampling/min_tokens.py`; ``eos_token_ids``:
    the model's)."""
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
    masked = _rows_before_min_tokens(batch, output, eos_token_ids)
    if masked:
        forbid_stop_tokens_inplace(output.logits, masked)


def _rows_before_min_tokens(
    batch: list[ScheduledRequest], output: ForwardOutput, eos_token_ids: frozenset[int]
) -> list[StopMaskedRows]:
    masked = []
    for i, s in enumerate(batch):
        params = s.request.sampling_params
        if not params.min_tokens or not has_rows(output, i, s):
            continue
        num_rows = num_rows_before_min_tokens(
            params.min_tokens, s.request.num_output_tokens, 1 + len(s.draft_token_ids)
        )
        if num_rows:
            stop_ids = _stop_token_ids(params, eos_token_ids, output.logits.shape[-1])
            masked.append(StopMaskedRows(output.cu_logit_rows[i], num_rows, stop_ids))
    return masked


def _stop_token_ids(params, eos_token_ids: frozenset[int], vocab_size: int) -> list[int]:
    """The ids a request's stop check ends on (`output_processor.py`): its stop_token_ids, and the
    model's EOS ids unless it ignores EOS; those outside the vocabulary can never be sampled anyway."""
    ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    return sorted(t for t in ids if t < vocab_size)


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
