"""What the server bounds so that one client cannot stall or fill it for the others: the body's size
(413 before it is read), a prompt's text (400 before it is tokenized), tokenization off the event loop
(``/health`` answers meanwhile), the Responses store in bytes and ``user`` in length, and the queue in
sequences (prompts x ``n``), not prompts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import httpx
import pytest
from factories import assert_all_pages_free
from guided_runs import guided_executor
from served import served, served_engine, wait_until_idle
from specexec.server.app import ServerLimits
from specexec.server.limits.body import default_max_body_bytes
from specexec.server.limits.text_bounds import MAX_USER_CHARS, max_chars_per_token
from specexec.server.responses_api import ResponseStore, StoredResponse

CHAT = "/v1/chat/completions"


@contextlib.contextmanager
def tokenizer_held_on(executor, marker: str):
    """While the block runs, rendering a chat whose last message holds ``marker`` waits (in whatever
    thread renders it) until ``release`` is set; ``entered`` is set once it waits. Other chats render
    as they did. Yields (entered, release)."""
    tokenizer = executor.tokenizer
    render = tokenizer.apply_chat_template
    entered, release = threading.Event(), threading.Event()

    def held(messages, *args, **kwargs):
        if marker in str(messages[-1].get("content")):
            entered.set()
            release.wait(30)
        return render(messages, *args, **kwargs)

    tokenizer.apply_chat_template = held
    try:
        yield entered, release
    finally:
        release.set()
        del tokenizer.apply_chat_template  # (the class's method again)


def chat_body(content: str = "Hi", **fields) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2, **fields}


def test_the_default_body_limit_follows_the_context_above_a_floor():
    assert default_max_body_bytes(2048) == 8 << 20  # (the floor: tools and schemas beside the prompt)
    assert default_max_body_bytes(131072) == 131072 * 256


def test_a_body_past_the_limit_is_refused_with_413_before_it_is_read():
    limits = ServerLimits(max_body_bytes=4096)
    with served(limits=limits) as (base, engine, stack):
        http = stack.enter_context(httpx.Client(base_url=base, timeout=30))
        # (padded in a field that does not reach the prompt: the tiny model's context is 256 tokens)
        fits = http.post(CHAT, json=chat_body(metadata={f"pad{i}": "x" * 500 for i in range(6)}))
        assert fits.status_code == 200, fits.text
        announced = http.post(CHAT, json=chat_body("x" * 5000))  # (its Content-Length says so)
        assert announced.status_code == 413
        error = announced.json()["error"]
        assert error["code"] == "request_too_large" and "4096" in error["message"]
        assert error["type"] == "invalid_request_error"

        def chunks():  # no Content-Length: the limit is met while reading
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(20):
                yield b"x" * 1000
            yield b'"}]}'

        with httpx.Client(base_url=base, timeout=30) as fresh:
            streamed = fresh.post(CHAT, content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "request_too_large"
        assert http.get("/health").status_code == 200
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


def test_a_prompt_longer_than_the_context_could_hold_is_refused_before_it_is_tokenized():
    executor = guided_executor(dtype="float32")
    calls = []
    render = executor.tokenizer.apply_chat_template
    executor.tokenizer.apply_chat_template = lambda *a, **k: calls.append(1) or render(*a, **k)
    max_chars = executor.core.max_model_len * max_chars_per_token(executor.tokenizer)
    with served_engine(executor) as (base, engine, stack):
        http = stack.enter_context(httpx.Client(base_url=base, timeout=60))
        refused = http.post(CHAT, json=chat_body("a" * (max_chars + 1)))
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages"
        assert not calls, "the refused prompt was rendered"
        refused = http.post("/v1/completions", json={"prompt": "a" * (max_chars + 1), "max_tokens": 2})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt"
        refused = http.post("/v1/responses", json={"input": "a" * (max_chars + 1), "max_output_tokens": 2})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "input"
        assert not calls
        # one that may fit is tokenized, and refused by its token count
        long = http.post(CHAT, json=chat_body("a " * (executor.core.max_model_len + 10)))
        assert long.status_code == 400 and calls
    executor.tokenizer.apply_chat_template = render


def test_health_answers_while_a_prompt_is_being_tokenized():
    """The chat template of one request is held (as a long one takes seconds): on the event loop it
    would hold /health too, for as long as it takes; off it, /health answers at once."""
    executor = guided_executor(dtype="float32")
    with (
        tokenizer_held_on(executor, "HOLD") as (entered, release),
        served_engine(executor) as (base, engine, stack),
    ):
        http = stack.enter_context(httpx.Client(base_url=base, timeout=10))
        outcome: dict = {}
        slow = threading.Thread(
            target=lambda: outcome.update(answer=httpx.post(base + CHAT, json=chat_body("HOLD"), timeout=60))
        )
        slow.start()
        assert entered.wait(30), "the held request was never rendered"
        began = time.monotonic()
        health = http.get("/health", timeout=5)
        took = time.monotonic() - began
        # another chat waits its turn (submits keep their order) and is answered once the held one goes on
        behind = threading.Thread(
            target=lambda: outcome.update(
                other=httpx.post(base + CHAT, json=chat_body("Not held"), timeout=60)
            )
        )
        behind.start()
        release.set()
        slow.join(60)
        behind.join(60)
        assert health.status_code == 200 and took < 0.5, took
        assert outcome["other"].status_code == 200 and outcome["answer"].status_code == 200
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


def test_the_queue_limit_counts_samples_not_prompts():
    limits = ServerLimits(max_queued_requests=100)
    with served(limits=limits) as (base, engine, stack):
        http = stack.enter_context(httpx.Client(base_url=base, timeout=120))
        prompts = [f"Prompt {i}" for i in range(64)]
        refused = http.post("/v1/completions", json={"prompt": prompts, "n": 16, "max_tokens": 1})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert "1024 asked" in refused.json()["error"]["message"]
        fits = http.post("/v1/completions", json={"prompt": prompts[:6], "n": 16, "max_tokens": 1})
        assert fits.status_code == 200 and len(fits.json()["choices"]) == 96
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


def test_requests_admitted_together_count_before_they_reach_the_engine():
    """Requests of 16 and 96 sequences under a limit of 100: the second is refused although the first
    has not reached the engine yet (its chat template is held); alone it fits."""
    executor = guided_executor(dtype="float32")
    limits = ServerLimits(max_queued_requests=100)

    async def both(base: str):
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            first = asyncio.create_task(http.post(CHAT, json=chat_body("HOLD", n=16)))
            while not entered.is_set():
                await asyncio.sleep(0.01)
            second = await http.post(
                "/v1/completions", json={"prompt": list("abcdef"), "n": 16, "max_tokens": 1}
            )
            release.set()
            return await first, second

    with (
        tokenizer_held_on(executor, "HOLD") as (entered, release),
        served_engine(executor, limits) as (base, engine, stack),
    ):
        first, second = asyncio.run(both(base))
        assert first.status_code == 200 and second.status_code == 503, (first.text, second.text)
        assert "16 sequences queued, 96 asked" in second.json()["error"]["message"]
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


def test_the_responses_store_is_bounded_in_bytes_and_drops_the_oldest_first():
    store = ResponseStore(max_bytes=10_000)
    for i in range(8):
        store.put(f"r{i}", StoredResponse([{"role": "user", "content": "x" * 2000}], {"id": f"r{i}"}))
        assert store.num_bytes <= 10_000
    kept = [f"r{i}" for i in range(8) if store.get(f"r{i}", "") is not None]
    assert kept == ["r4", "r5", "r6", "r7"]
    store.put("huge", StoredResponse([{"role": "user", "content": "x" * 20_000}], {"id": "huge"}))
    assert (
        store.get("huge", "") is None and store.get("r7", "") is not None
    )  # (kept nothing, dropped nothing)
    assert store.delete("r7", "") and store.num_bytes == sum(
        store.get(k, "").num_bytes for k in ("r4", "r5", "r6")
    )


def test_a_long_user_is_refused_and_a_stored_response_counts_what_it_holds():
    limits = ServerLimits(max_stored_response_bytes=20_000)
    with served(limits=limits) as (base, engine, stack):
        http = stack.enter_context(httpx.Client(base_url=base, timeout=60))
        for path, body in (
            ("/v1/responses", {"input": "Hi", "max_output_tokens": 2, "user": "u" * (MAX_USER_CHARS + 1)}),
            (CHAT, chat_body(user="u" * (MAX_USER_CHARS + 1))),
        ):
            refused = http.post(path, json=body)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "user", path
        ids = []
        # (each holds ~8 KB of metadata, echoed in its body: the tiny model's context is 256 tokens)
        metadata = {f"key{i}": "y" * 500 for i in range(16)}
        for _ in range(6):
            answer = http.post(
                "/v1/responses", json={"input": "Hi", "max_output_tokens": 2, "metadata": metadata}
            )
            assert answer.status_code == 200, answer.text
            ids.append(answer.json()["id"])
        assert http.get(f"/v1/responses/{ids[-1]}").status_code == 200
        assert http.get(f"/v1/responses/{ids[0]}").status_code == 404  # (dropped for the budget)
        assert json.loads(http.get(f"/v1/responses/{ids[-1]}").text)["user"] is None
        wait_until_idle(engine)


@pytest.mark.parametrize("size", [1, 3])
def test_the_store_keeps_its_count_bound_too(size):
    store = ResponseStore(limit=size)
    for i in range(5):
        store.put(f"r{i}", StoredResponse([], {"id": f"r{i}"}))
    assert [k for k in (f"r{i}" for i in range(5)) if store.get(k, "")] == [
        f"r{i}" for i in range(5 - size, 5)
    ]
