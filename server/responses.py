"""OpenAI response shapes: full responses, stream chunks, usage, log-probabilities, error objects."""

from __future__ import annotations

import json
import math
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..executor.engine.request import FinishReason, RequestOutput, TokenEvent
from ..sampling.logprobs import TokenLogprob
from .protocol import ParsedRequest
from .tools import read_calls, tool_calls_json

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

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else str(token_id)

    def decode(self, token_ids: list[int]) -> str:
        return (
            self.tokenizer.decode(token_ids) if self.tokenizer is not None else " ".join(map(str, token_ids))
        )

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
    """Every sample's tokens; each prompt's once (sample 0 of each prompt counts it)."""
    prompt = sum(o.metrics.num_prompt_tokens for o in samples if o.sample_index == 0)
    cached = sum(o.metrics.num_cached_tokens for o in samples if o.sample_index == 0)
    completion = sum(o.metrics.num_output_tokens for o in samples)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},  # (from the prefix cache)
    }


def full_response(per_prompt: list[list[RequestOutput]], parsed: ParsedRequest, ids: ResponseIds) -> dict:
    """``per_prompt``: each prompt's samples, in order; choice ``index`` = prompt * n + sample."""
    n = parsed.request.sampling_params.n
    choices = []
    for p, samples in enumerate(per_prompt):
        for sample in samples:
            choice: dict = {"index": p * n + sample.sample_index, "finish_reason": str(sample.finish_reason)}
            if parsed.is_chat:
                choice["message"], finish = _message(sample, parsed)
                choice["finish_reason"] = finish
                choice["logprobs"] = _logprobs(sample.logprobs, parsed, ids)
            else:
                echoed = _echoed(sample, parsed, ids, p)
                choice["text"] = (echoed[0] if echoed else "") + sample.text
                choice["logprobs"] = _logprobs(sample.logprobs, parsed, ids, echoed)
            if sample.prompt_logprobs is not None:  # vLLM's field
                choice["prompt_logprobs"] = _prompt_logprobs(sample, ids)
            choices.append(choice)
    samples = [s for group in per_prompt for s in group]
    return {**ids.head(chunk=False), "choices": choices, "usage": usage(samples)}


def _message(sample: RequestOutput, parsed: ParsedRequest, with_index: bool = False) -> tuple[dict, str]:
    """The assistant message of a chat sample (its tool calls read when it has tools) and the finish
    reason (``tool_calls`` when it called any and stopped by itself)."""
    finish = str(sample.finish_reason)
    plan = parsed.tool_plan
    if plan is None or not plan.reads_calls:
        return {"role": "assistant", "content": sample.text}, finish
    content, calls = read_calls(plan, sample.text)
    message: dict = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = tool_calls_json(calls, with_index)
        if sample.finish_reason is FinishReason.STOP:
            finish = "tool_calls"
    return message, finish


def delta_chunk(sample_index: int, delta: dict, ids: ResponseIds, finish: str | None = None) -> dict:
    """A streamed chat sample's chunk with tools (`tool_stream.py`): content, or one piece of one tool
    call (``{"tool_calls": [...]}``), or the finish reason after the last."""
    if "content" not in delta and delta:
        delta = {"tool_calls": [delta]}
    choice = {"index": sample_index, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {**ids.head(chunk=True), "choices": [choice]}


def _echoed(sample: RequestOutput, parsed: ParsedRequest, ids: ResponseIds, prompt_index: int):
    """With ``echo``: (the prompt's text, its token ids, their entries or None); else None."""
    if not parsed.echo:
        return None
    given = parsed.prompt_texts[prompt_index] if parsed.prompt_texts else None
    text = given if given is not None else ids.decode(sample.prompt_token_ids)
    return text, sample.prompt_token_ids, sample.prompt_logprobs


def _prompt_logprobs(sample: RequestOutput, ids: ResponseIds) -> list:
    """vLLM's shape: per prompt token None (the first) or {token id: {logprob, decoded_token}} for the
    token itself and its likeliest alternatives."""
    out: list = []
    for entry in sample.prompt_logprobs or []:
        if entry is None:
            out.append(None)
            continue
        ranked = {entry.token_id: entry.logprob, **dict(entry.top)}
        out.append(
            {str(t): {"logprob": _value(v), "decoded_token": ids.token_text(t)} for t, v in ranked.items()}
        )
    return out


def first_chunk(parsed: ParsedRequest, ids: ResponseIds) -> dict:
    """Chat streams open with the role (OpenAI's first delta), once per sample."""
    choices = [
        {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        for i in range(parsed.request.sampling_params.n)
    ]
    return {**ids.head(chunk=True), "choices": choices}


def chunk(
    event: TokenEvent, parsed: ParsedRequest, ids: ResponseIds, usage_so_far: dict | None = None
) -> dict:
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


def echo_chunk(parsed: ParsedRequest, ids: ResponseIds) -> dict:
    """A streamed completion with ``echo``: its prompt's text (as sent, or its ids decoded), first."""
    given = parsed.prompt_texts[0] if parsed.prompt_texts else None
    text = given if given is not None else ids.decode(list(parsed.request.prompt))
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
    return {**ids.head(chunk=True), "choices": [choice]}


def usage_chunk(samples: list[RequestOutput], ids: ResponseIds) -> dict:
    return {**ids.head(chunk=True), "choices": [], "usage": usage(samples)}


def _value(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else MIN_LOGPROB


def _logprobs(entries: list[TokenLogprob] | None, parsed: ParsedRequest, ids: ResponseIds, echoed=None):
    """OpenAI's shapes: chat ``{"content": [{token, logprob, bytes, top_logprobs}]}``; completions
    ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, the prompt's tokens first with
    ``echo`` (the first with null: nothing scores it)."""
    if parsed.num_top_logprobs is None or entries is None:
        return None
    text = ids.token_text
    if parsed.is_chat:
        content = []
        for e in entries:
            token = text(e.token_id)
            top = [
                {"token": text(t), "logprob": _value(v), "bytes": list(text(t).encode())} for t, v in e.top
            ]
            content.append(
                {
                    "token": token,
                    "logprob": _value(e.logprob),
                    "bytes": list(token.encode()),
                    "top_logprobs": top,
                }
            )
        return {"content": content}
    tokens, values, tops = [], [], []
    if echoed is not None:
        _, prompt_ids, prompt_entries = echoed
        for token_id, e in zip(prompt_ids, prompt_entries or [None] * len(prompt_ids)):
            tokens.append(text(token_id))
            values.append(None if e is None else _value(e.logprob))
            tops.append(None if e is None else _top(e, parsed.num_top_logprobs, text))
    for e in entries:
        tokens.append(text(e.token_id))
        values.append(_value(e.logprob))
        tops.append(_top(e, parsed.num_top_logprobs, text))
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _top(entry: TokenLogprob, k: int, text) -> dict:
    return {text(t): _value(v) for t, v in entry.top[:k]}
