"""``specexec bench --server URL``: drive a running OpenAI-compatible server with the same workload.

Like with like: each request sends the same token ids the in-process engines get (``/v1/completions``
with a token-id prompt: the chat template was rendered once, here; with ``--server-prompts text`` those
ids decoded, for a server or router that takes text only, as sglang-router does), the served model's
name as ``model``, the same max tokens, temperature and
per-request seed, the bench's stop set as ``stop_token_ids`` (vLLM's extension, which `specexec serve`
takes too), with ``--ignore-eos`` also ``min_tokens`` = max tokens (vLLM's extension: the set cannot
be sampled, so nothing stops a request early), and with ``--guided`` the prompt's schema as
``response_format``. ``logprobs: 0`` makes each chunk name its tokens, the one way over this API to
count the stop tokens sampled (a log-softmax per token on the server). Streams are read as server-sent
events; TTFT and TPOT are measured at the client, from the moment a request is sent (the first chunk
with text, then the time between it and the last). ``concurrency`` requests are in flight at a time.
Speculation figures (drafts, acceptance) come from the server's ``/metrics``, before and after the run.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...prompt_sets.datasets import BenchPrompt
from ..records import RequestRecord, schema_valid
from .specexec_hf import Workload, _failed_record

_SPEC_COUNTERS = {
    "specexec:spec_decode_num_draft_tokens_total": "num_draft_tokens",
    "specexec:spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
    # llama-server's, under --metrics
    "llamacpp:spec_decode_num_draft_tokens_total": "num_draft_tokens",
    "llamacpp:spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
}


@dataclass(frozen=True, slots=True)
class ServerTarget:
    """Where requests go and how they are sent."""

    url: str
    model: str | None = None  #: the ``model`` field (the server's own, from /v1/models)
    api_key: str | None = None
    #: each prompt's rendered text (its ids decoded), sent instead of the ids; None: the ids
    prompt_texts: list[str] | None = None
    #: "openai" (with vLLM's stop_token_ids and min_tokens) or "llama-server" (its ignore_eos; it stops at
    #: the GGUF's end-of-generation tokens by itself and names no tokens in its stream's log-probabilities)
    dialect: str = "openai"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def server_base(target: ServerTarget) -> str:
    """The server's root (``/v1`` and a trailing slash taken off the URL given)."""
    return target.url.rstrip("/").removesuffix("/v1")


def run_server(
    target: ServerTarget | str,
    work: Workload,
    concurrency: int,
    on_done: Callable[[], None] = lambda: None,
    api_key: str | None = None,
    stop_texts: frozenset[str] = frozenset(),
) -> tuple[list[RequestRecord], float, dict]:
    """Records in prompt order, the wall time, and the server's speculation counters over the run.
    ``stop_texts``: the stop set's tokens as the server names them in log-probabilities (the tokenizer's
    decoding of each alone), to count those sampled."""
    import httpx

    if isinstance(target, str):
        target = ServerTarget(target, api_key=api_key)
    base, headers = server_base(target), target.headers()
    before = spec_counters(httpx, base)
    records, wall = asyncio.run(_run(httpx, base, headers, work, concurrency, on_done, stop_texts, target))
    after = spec_counters(httpx, base)
    return records, wall, {k: after.get(k, 0) - before.get(k, 0) for k in after}


def check_server(url: str) -> str:
    """The model the server serves (its first ``/v1/models`` entry); a ValueError when unreachable."""
    import httpx

    base = url.rstrip("/").removesuffix("/v1")
    try:
        models = httpx.get(f"{base}/v1/models", timeout=10).json()["data"]
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        raise ValueError(f"--server {url}: no OpenAI-compatible server answers there ({exc})") from exc
    return models[0]["id"]


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One request to send: its prompt (for its id and schema), its token ids and seed; ``text``: the
    ids' decoding, sent instead of them to a target that takes text."""

    prompt: BenchPrompt
    ids: list[int]
    seed: int
    text: str | None = None


def client_for(httpx, base: str, headers: dict, target: ServerTarget):
    """The run's HTTP client. llama-server (cpp-httplib) drops some kept-alive connections as a request
    goes out on them ("Server disconnected without sending a response": 1-3 requests of 16 a row): there
    a fresh connection a request (on loopback a fraction of a millisecond, inside the measured TTFT)."""
    keep_alive = 0 if target.dialect == "llama-server" else 20  # (20: httpx's default)
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=keep_alive)
    return httpx.AsyncClient(base_url=base, headers=headers, timeout=None, limits=limits)


async def _run(
    httpx, base: str, headers: dict, work: Workload, concurrency: int, on_done, stop_texts, target
):
    limit = asyncio.Semaphore(concurrency)
    start = time.perf_counter()
    texts = target.prompt_texts
    async with client_for(httpx, base, headers, target) as client:

        async def one(i: int) -> RequestRecord:
            outgoing = Outgoing(work.prompts[i], work.token_ids[i], i, texts[i] if texts else None)
            async with limit:
                record = await request_record(client, work, outgoing, stop_texts, target)
            on_done()
            return record

        records = await asyncio.gather(*(one(i) for i in range(len(work.prompts))))
    return list(records), time.perf_counter() - start


def request_body(work: Workload, outgoing: Outgoing, target: ServerTarget | None = None) -> dict:
    """The request's body: the stop set as stop tokens, with ``ignore_eos`` banned until max_tokens (for
    llama-server: its own ignore_eos, which bans its end-of-generation tokens)."""
    body = {
        "prompt": outgoing.text if outgoing.text is not None else outgoing.ids,
        "max_tokens": work.max_tokens,
        "temperature": work.temperature,
        "seed": outgoing.seed,
        "logprobs": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if target is not None and target.model is not None:  # (a router in front fills in "unknown")
        body["model"] = target.model
    if target is not None and target.dialect == "llama-server":
        del body["logprobs"]  # (its stream names no tokens there; n_probs would only cost it time)
        if work.ignore_eos:
            body["ignore_eos"] = True
        return body
    if work.stop_token_ids:
        body["stop_token_ids"] = list(work.stop_token_ids)
    if work.ignore_eos:
        body["min_tokens"] = work.max_tokens
    return body


async def request_record(
    client, work: Workload, outgoing: Outgoing, stop_texts: frozenset[str], target: ServerTarget
) -> RequestRecord:
    """One request's record; a failed one where the server answers with an error, or closes the
    connection or cannot be reached (a server that died fails the requests left, not the bench)."""
    import httpx

    try:
        return await _stream_request(client, work, outgoing, stop_texts, target)
    except httpx.TransportError as exc:
        return _failed_record(outgoing.prompt, outgoing.ids, f"{type(exc).__name__}: {exc}")


async def _stream_request(
    client, work: Workload, outgoing: Outgoing, stop_texts: frozenset[str], target
) -> RequestRecord:
    prompt, ids = outgoing.prompt, outgoing.ids
    body = request_body(work, outgoing, target)
    if work.guided and prompt.schema:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "b", "schema": prompt.schema},
        }
    sent = time.perf_counter()
    first = last = None
    texts, finish, usage, error = [], "length", None, None
    num_stops: int | None = 0  #: None once a chunk comes without its tokens
    done_sent = False  #: an OpenAI stream's last line; a stream that ends without it was cut off
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            return _failed_record(
                prompt, ids, f"HTTP {response.status_code}: {_message(await response.aread())}"
            )
        async for line in response.aiter_lines():
            if line.strip() == "data: [DONE]":
                done_sent = True
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                error = chunk["error"].get("message", "error")
                continue
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", ()):
                tokens = (choice.get("logprobs") or {}).get("tokens")
                if tokens is None and choice.get("text"):
                    num_stops = None
                elif tokens is not None and num_stops is not None:
                    num_stops += sum(t in stop_texts for t in tokens)
                if choice.get("text"):
                    last = time.perf_counter()
                    first = first or last
                    texts.append(choice["text"])
                finish = choice.get("finish_reason") or finish
    done = time.perf_counter()
    if error is None and not done_sent:
        error = (
            f"the stream ended after {len(texts)} chunks without its 'data: [DONE]' (the server closed it)"
        )
    if error is not None:
        return _failed_record(prompt, ids, error)
    num_output = usage["completion_tokens"] if usage else 0
    text = "".join(texts)
    return RequestRecord(
        id=prompt.id,
        num_prompt_tokens=len(ids),
        num_output_tokens=num_output,
        latency_ms=(done - sent) * 1000,
        ttft_ms=None if first is None else (first - sent) * 1000,
        tpot_ms=(last - first) * 1000 / (num_output - 1) if first is not None and num_output > 1 else None,
        finish_reason=finish,
        schema_valid=schema_valid(text, prompt.schema),
        text=text,
        num_stop_tokens=num_stops,
    )


def _message(body: bytes) -> str:
    """An error body's message: OpenAI's ``error.message``, or the text as it came (a router's own)."""
    try:
        return str(json.loads(body).get("error", {}).get("message", ""))
    except (ValueError, AttributeError):
        return body.decode(errors="replace")[:300]


def spec_counters(httpx, base: str) -> dict[str, float]:
    """The server's speculation counters (empty when it has no /metrics)."""
    try:
        text = httpx.get(f"{base}/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    counters = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in _SPEC_COUNTERS:
            counters[_SPEC_COUNTERS[name]] = float(value)
    return counters
