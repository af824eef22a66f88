"""OpenAI response shapes: full responses, stream chunks, usage, error objects."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from ..executor.request import RequestOutput, TokenEvent
from .protocol import ParsedRequest


@dataclass(slots=True)
class ResponseIds:
    """What every chunk of one response repeats."""

    is_chat: bool
    model: str
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


def error_body(message: str, kind: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def sse(payload: dict) -> bytes:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def usage(outputs: list[RequestOutput]) -> dict:
    prompt = outputs[0].metrics.num_prompt_tokens
    completion = sum(o.metrics.num_output_tokens for o in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def samples_of(output: RequestOutput) -> list[RequestOutput]:
    """The n samples of a request (one, unless it asked for n > 1)."""
    return list(getattr(output, "samples", None) or [output])


def full_response(output: RequestOutput, parsed: ParsedRequest, ids: ResponseIds) -> dict:
    samples = samples_of(output)
    choices = []
    for index, sample in enumerate(samples):
        choice: dict = {"index": index, "finish_reason": str(sample.finish_reason)}
        if parsed.is_chat:
            choice["message"] = {"role": "assistant", "content": sample.text}
        else:
            choice["text"] = sample.text
        choice["logprobs"] = None
        choices.append(choice)
    return {**ids.head(chunk=False), "choices": choices, "usage": usage(samples)}


def first_chunk(parsed: ParsedRequest, ids: ResponseIds) -> dict:
    """Chat streams open with the role (OpenAI's first delta)."""
    n = getattr(parsed.request.sampling_params, "n", 1)
    choices = [
        {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        for i in range(n)
    ]
    return {**ids.head(chunk=True), "choices": choices}


def chunk(event: TokenEvent, parsed: ParsedRequest, ids: ResponseIds) -> dict:
    index = getattr(event, "sample_index", 0)
    finish = str(event.output.finish_reason) if event.finished and event.output is not None else None
    choice: dict = {"index": index, "finish_reason": finish}
    if parsed.is_chat:
        choice["delta"] = {"content": event.text} if event.text else {}
    else:
        choice["text"] = event.text
    choice["logprobs"] = None
    return {**ids.head(chunk=True), "choices": [choice]}


def usage_chunk(output: RequestOutput, parsed: ParsedRequest, ids: ResponseIds) -> dict:
    return {**ids.head(chunk=True), "choices": [], "usage": usage(samples_of(output))}
