"""Appends sampled tokens to requests, checks the stop conditions, and builds outputs and events."""

from __future__ import annotations

import time

import torch

from .request import FinishReason, RequestOutput, RequestState, TokenEvent

#: the decoder's replacement character: text ending in it is waiting for the rest of a character
INCOMPLETE_CHAR = "\ufffd"


class OutputProcessor:
    def __init__(self, tokenizer, max_model_len: int, eos_token_ids: frozenset[int] = frozenset()) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.eos_token_ids = (
            eos_token_ids  #: the model's end-of-sequence ids (tokenizer and generation config)
        )

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def append_tokens(self, request: RequestState, token_ids: list[int]) -> list[int]:
        """Append tokens one by one until a stop condition holds; returns the tokens kept."""
        kept = []
        for token in token_ids:
            request.token_ids.append(token)
            kept.append(token)
            if request.metrics.first_token_time is None:
                request.metrics.first_token_time = time.perf_counter()
            reason = self._stop_reason(request, token)
            if reason is not None:
                request.finish_reason = reason
                break
        request.metrics.num_output_tokens = request.num_output_tokens
        return kept

    def _stop_reason(self, request: RequestState, token: int) -> FinishReason | None:
        params = request.sampling_params
        if params.stop and self._hit_stop_string(request):  # first: it keeps request.text current
            return FinishReason.STOP
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            return FinishReason.STOP
        if request.num_output_tokens >= params.max_tokens or request.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _hit_stop_string(self, request: RequestState) -> bool:
        """Update the request's text; on a stop string, cut the text where it starts."""
        old_len = len(request.text)
        request.text = self.decode(request.output_token_ids)
        hits = []
        for stop in request.sampling_params.stop:
            at = request.text.find(stop, max(0, old_len - len(stop) + 1))
            if at >= 0:
                hits.append(at)
        if hits:
            request.text = request.text[: min(hits)]
        return bool(hits)

    def text_delta(self, request: RequestState) -> str:
        """New text since the last call (streaming); held back while it ends mid-character."""
        if not request.sampling_params.stop:  # stop-string requests keep their text current already
            request.text = self.decode(request.output_token_ids)
        text = request.text
        if not request.finish_reason:
            if text.endswith(INCOMPLETE_CHAR):
                return ""
            # hold back a tail that may be the start of a stop string
            held = max(
                (
                    k
                    for stop in request.sampling_params.stop
                    for k in range(1, len(stop))
                    if text.endswith(stop[:k])
                ),
                default=0,
            )
            text = text[: len(text) - held]
        delta = text[request.num_text_sent :]
        request.num_text_sent = len(text)
        return delta

    def finalize_text(self, request: RequestState) -> str:
        """The output's final text (a matched stop string cut off)."""
        if request.num_output_tokens and not request.sampling_params.stop:  # (stop strings keep it current)
            request.text = self.decode(request.output_token_ids)
        return request.text

    def make_output(self, request: RequestState) -> RequestOutput:
        self.finalize_text(request)
        return RequestOutput(
            request_id=request.request_id,
            text=request.text,
            token_ids=list(request.output_token_ids),
            finish_reason=request.finish_reason or FinishReason.LENGTH,
            prompt_token_ids=request.token_ids[: request.num_prompt_tokens],
            error=request.error,
            is_invalid_request=request.is_invalid_request,
            metrics=request.metrics,
            guided_valid=request.guided_valid,
            guided_error=request.guided_error,
            warnings=list(request.guided_warnings),
            hidden_states=torch.cat([rows for _, rows in request.captured_hidden])
            if request.captured_hidden
            else None,
            logprobs=list(request.logprobs) if _asks_logprobs(request) else None,
            prompt_logprobs=list(request.prompt_logprobs) if request.prompt_logprobs else None,
            sample_index=request.sample_index,
        )

    def make_event(self, request: RequestState, new_tokens: list[int]) -> TokenEvent:
        finished = request.finish_reason is not None
        text = self.text_delta(request) if request.is_streaming else ""
        output = self.make_output(request) if finished else None
        logprobs = None
        if _asks_logprobs(request):
            logprobs = request.logprobs[len(request.logprobs) - len(new_tokens) :] if new_tokens else []
        return TokenEvent(
            request.request_id,
            new_tokens,
            text,
            finished,
            output,
            logprobs,
            request.sample_index,
            request.num_prompt_tokens,
        )


def _asks_logprobs(request: RequestState) -> bool:
    """(A request refused for its sampling_params may not hold a SamplingParams at all.)"""
    return getattr(request.sampling_params, "logprobs", None) is not None
