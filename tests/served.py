"""A server over a tiny executor, for the server tests: `served` (the guided tiny model with the SmolLM2
tokenizer, prefix caching on) or `served_engine` (any executor) running in a thread until the block
ends, an OpenAI `client` for it, `wait_until_idle`, and what the tests send (`MESSAGES`, an `NGRAM`
spec, the `WEATHER` and `CLOCK` tools, and `long_context_executor` with room for a prompt listing them)."""

from __future__ import annotations

import contextlib
import threading
import time

import openai
import uvicorn
from factories import free_port
from guided_runs import guided_executor
from specexec.executor.async_executor import AsyncExecutor
from specexec.server.app import build_app

NGRAM = {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 2}
MESSAGES = [{"role": "user", "content": "Say something about cats and dogs."}]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


@contextlib.contextmanager
def served(spec=None, limits=None, api_key=None):
    """(base URL, the AsyncExecutor, an ExitStack for the test's clients) of a server running until the
    block ends, over the tiny model with the SmolLM2 tokenizer; prefix caching on, as `specexec serve`
    has it (the references each test compares with run without it)."""
    with served_engine(
        guided_executor(spec, dtype="float32", enable_prefix_caching=True), limits, api_key
    ) as running:
        yield running


@contextlib.contextmanager
def served_engine(executor, limits=None, api_key=None):
    """`served` over any executor."""
    engine = AsyncExecutor(executor)
    app = build_app(engine, "tiny", api_key=api_key, limits=limits)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        with contextlib.ExitStack() as stack:  # the clients a test opens are closed before the server stops
            yield f"http://127.0.0.1:{port}", engine, stack
    finally:
        server.should_exit = True
        thread.join(30)


def client(base: str, api_key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=api_key, max_retries=0)


def wait_until_idle(engine: AsyncExecutor, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while engine.num_unfinished and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.num_unfinished == 0


def long_context_executor(spec):
    """`served`'s tiny model with room for a prompt that lists tools (1,024 positions)."""
    overrides = {"max_position_embeddings": 1024}
    return guided_executor(spec, dtype="float32", num_kv_blocks=512, model_overrides=overrides)
