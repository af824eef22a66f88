"""The endpoints routers and their operators call on a replica beside the OpenAI API, under the names
vLLM and SGLang serve them:

- ``POST /tokenize`` (``prompt``, or chat ``messages``) and ``POST /detokenize`` (``tokens``), vLLM's
  shapes: ``{"count", "max_model_len", "tokens"}`` and ``{"prompt"}``;
- ``GET /get_model_info`` and ``GET /get_server_info``, SGLang's (sglang-router 0.3 calls them
  ``/model_info`` and ``/server_info`` when a worker joins: both names answer): what is served, and how;
- ``POST /flush_cache`` (SGLang) and ``POST /reset_prefix_cache`` (vLLM): drop the prefix cache's pages
  that no request holds. They change the server's state, so they answer as admin endpoints do
  (`limits/access.py`): with the API key where one is set, else from loopback clients only.

A router health-checks ``GET /health`` (`service.py`), which answers 503 while the server drains.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from ...executor.engine.inputs import tokenize_prompt
from ..bad_request import BadRequest
from .state import ServerState


def add_worker_routes(app: FastAPI, state: ServerState) -> None:
    """Register the endpoints on ``app``: the API key where one is set, the admin rule for those that
    change the server's state (`limits/access.py`)."""
    executor = state.engine.executor
    tokenizer = executor.tokenizer
    max_model_len = executor.max_model_len
    vocab_size = executor.vocab_size
    check_key, read_body, check_admin = state.access.check_key, state.read_body, state.access.check_admin
    model_name = state.model_name

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        check_key(request)
        body = await read_body(request)
        prompt = _prompt_of(body)
        ids = await asyncio.to_thread(tokenize_prompt, prompt, tokenizer, vocab_size)  # (off the event loop)
        return JSONResponse({"count": len(ids), "max_model_len": max_model_len, "tokens": ids})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        check_key(request)
        body = await read_body(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(_is_id(t, vocab_size) for t in tokens):
            raise BadRequest(f"tokens must be a list of token ids in 0..{vocab_size - 1}", "tokens")
        return JSONResponse({"prompt": await asyncio.to_thread(tokenizer.decode, tokens)})

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info(request: Request) -> JSONResponse:
        check_key(request)
        return JSONResponse(
            {
                "model_path": model_name,
                "tokenizer_path": model_name,
                "is_generation": True,
                "preferred_sampling_params": None,
                "max_model_len": max_model_len,
            }
        )

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info(request: Request) -> JSONResponse:
        check_key(request)
        cfg = executor.config
        spec = cfg.speculative_config
        waiting, running = executor.queue_sizes()
        bm = executor.block_manager
        return JSONResponse(
            {
                "engine": "specexec",
                "version": _version(),
                "model_path": model_name,
                "max_model_len": max_model_len,
                "max_batch_size": cfg.max_batch_size,
                "dtype": str(cfg.dtype),
                "device": str(cfg.device),
                "speculative_decoding": spec.decoding_type if spec is not None else None,
                "enable_prefix_caching": bool(cfg.enable_prefix_caching),
                "num_requests_waiting": waiting,
                "num_requests_running": running,
                "kv_cache_pages": bm.num_blocks,
                "kv_cache_free_pages": bm.num_free_blocks,
                "internal_states": [{}],
            }
        )

    async def flush(request: Request) -> PlainTextResponse:
        check_admin(request)
        dropped = await asyncio.to_thread(executor.reset_prefix_cache)
        return PlainTextResponse(f"Cache flushed: {dropped} cached pages dropped.\n")

    app.post("/flush_cache")(flush)
    app.post("/reset_prefix_cache")(flush)


def _prompt_of(body: dict) -> Any:
    """vLLM's /tokenize body: ``prompt`` (text) or ``messages`` (chat, with the generation prompt)."""
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise BadRequest("send prompt (text) or messages (a chat), one of them", "prompt")
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("prompt must be non-empty text", "prompt")
        return prompt
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("messages must be a non-empty list of {role, content} objects", "messages")
    return messages


def _is_id(token: Any, vocab_size: int) -> bool:
    return isinstance(token, int) and not isinstance(token, bool) and 0 <= token < vocab_size


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specexec")
    except PackageNotFoundError:
        return "unknown"
