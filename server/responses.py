"""OpenAI response shapes: full responses, stream chunks, usage, log-probabilities, error objects."""

from __future__ import annotations

import json
import math
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..executor.engine.request import RequestOutput, TokenEvent
from ..sampling.logprobs import TokenLogprob
from .protocol import ParsedRequest

#: JSON has no -inf: a token the request's processing excluded gets this (vLLM's choice too)
MIN_LOGPROB = -9999.0


@dataclass(slots=True)
class ResponseIds:
    """What every chunk of one response repeats, and the tokenizer for log-probabilities' tokens."""

    is_chat: bool
    model: str
    tokenizer: Any = None
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = f"{'chatcmpl' if self.is_chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"

    def head(self, chunk: bool) -> dict:
        kind = "chat.completion" if self.is_chat else "text_completion"
        return {
            "id": self.id,
            "object": kind + (".chunk" if chunk and self.is_chat else ""),
            "created": self.created,
            "model": self.model,
        }


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object: ``code`` a short string where there is one (``model_not_found``,
    ``invalid_api_key``), else null; the HTTP status is the response's own."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def sse(payload: dict) -> bytes:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def usage(samples: list[RequestOutput]) -> dict:
    prompt = samples[0].metrics.num_prompt_tokens if samples else 0
    completion = sum(o.metrics.num_output_tokens for o in samples)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def full_response(samples: list[RequestOutput], parsed: ParsedRequest, ids: ResponseIds) -> dict:
    choices = []
    for sample in samples:
        choice: dict = {"index": sample.sample_index, "finish_reason": str(sample.finish_reason)}
        if parsed.is_chat:
            choice["message"] = {"role": "assistant", "content": sample.text}
        else:
            choice["text"] = sample.text
        choice["logprobs"] = _logprobs(sample.logprobs, parsed, ids)
        choices.append(choice)
    return {**ids.head(chunk=False), "choices": choices, "usage": usage(samples)}


def first_chunk(parsed: ParsedRequest, ids: ResponseIds) -> dict:
    """Chat streams open with the role (OpenAI's first delta), once per sample."""
    choices = [
        {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        for i in range(parsed.request.sampling_params.n)
    ]
    return {**ids.head(chunk=True), "choices": choices}


def chunk(event: TokenEvent, parsed: ParsedRequest, ids: ResponseIds, usage_so_far: dict | None = None) -> dict:
    """One stream chunk; ``usage_so_far`` (stream_options.continuous_usage_stats) rides along."""
    finish = str(event.output.finish_reason) if event.finished and event.output is not None else None
    choice: dict = {"index": event.sample_index, "finish_reason": finish}
    if parsed.is_chat:
        choice["delta"] = {"content": event.text} if event.text else {}
    else:
        choice["text"] = event.text
    choice["logprobs"] = _logprobs(event.logprobs, parsed, ids)
    body = {**ids.head(chunk=True), "choices": [choice]}
    if usage_so_far is not None:
        body["usage"] = usage_so_far
    if parsed.obfuscation:  # OpenAI's: random padding so a chunk's size does not give its text away
        body["obfuscation"] = secrets.token_urlsafe(secrets.randbelow(12) + 4)
    return body


def usage_chunk(samples: list[RequestOutput], ids: ResponseIds) -> dict:
    return {**ids.head(chunk=True), "choices": [], "usage": usage(samples)}


def _logprobs(entries: list[TokenLogprob] | None, parsed: ParsedRequest, ids: ResponseIds):
    """OpenAI's shapes: chat ``{"content": [{token, logprob, bytes, top_logprobs}]}``; completions
    ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``."""
    if parsed.num_top_logprobs is None or entries is None:
        return None

    def text(token_id: int) -> str:
        return ids.tokenizer.decode([token_id]) if ids.tokenizer is not None else str(token_id)

    def value(logprob: float) -> float:
        return logprob if math.isfinite(logprob) else MIN_LOGPROB

    if parsed.is_chat:
        content = []
        for e in entries:
            token = text(e.token_id)
            top = [{"token": text(t), "logprob": value(v), "bytes": list(text(t).encode())} for t, v in e.top]
            content.append(
                {
                    "token": token,
                    "logprob": value(e.logprob),
                    "bytes": list(token.encode()),
                    "top_logprobs": top,
                }
            )
        return {"content": content}
    tokens = [text(e.token_id) for e in entries]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [value(e.logprob) for e in entries],
        "top_logprobs": [{text(t): value(v) for t, v in e.top} for e in entries],
        "text_offset": offsets,
    }
