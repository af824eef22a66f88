"""Hostile input gets a 400 naming what is wrong, never a 500 or a traceback, and leaves nothing behind:
lone surrogates (a tokenizer's TypeError was a 500 that left its request id registered for ever),
``[`` x 100,000 (RecursionError in the JSON parser), schemas nested thousands deep. And who may call
what: the admin endpoints (the API key, or loopback without one), stored responses (their key's)."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
from factories import assert_all_pages_free
from guided_runs import guided_executor
from served import MESSAGES, served, wait_until_idle
from specexec import Request, SamplingParams
from specexec.executor.async_executor import AsyncExecutor
from specexec.server.app import build_app
from specexec.server.limits.access import key_identity
from specexec.server.limits.body import MAX_JSON_DEPTH

CHAT = "/v1/chat/completions"
JSON = {"content-type": "application/json"}


def nested_schema(depth: int) -> str:
    """A JSON schema of arrays nested ``depth`` deep, as text (json.dumps itself recurses)."""
    return '{"type": "array", "items": ' * depth + '{"type": "integer"}' + "}" * depth


def raw_chat(extra: str) -> bytes:
    return ('{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, ' + extra + "}").encode()


def test_a_lone_surrogate_is_a_400_naming_the_field_and_leaves_no_request_behind():
    with served() as (base, engine, stack):
        http = stack.enter_context(httpx.Client(base_url=base, timeout=60))
        cases = [
            (CHAT, b'{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 2}', "messages"),
            ("/v1/completions", b'{"prompt": "\\udfff", "max_tokens": 2}', "prompt"),
            ("/v1/responses", b'{"input": "\\ud800", "max_output_tokens": 2}', "input"),
            (CHAT, b'{"messages": [{"role": "user", "content": "Hi"}], "stop": ["\\ud800"]}', "stop"),
            (CHAT, b'{"messages": [{"role": "user", "content": "Hi", "\\ud800": 1}]}', "messages"),
            ("/tokenize", b'{"prompt": "\\ud800"}', "prompt"),
        ]
        for path, body, param in cases:
            answer = http.post(path, content=body, headers=JSON)
            assert answer.status_code == 400, (path, body, answer.text)
            error = answer.json()["error"]
            assert error["param"] == param and "surrogate" in error["message"], error
        assert engine.executor._loop.unfinished_ids() == []
        emoji = http.post(
            CHAT, content=raw_chat('"user": "\\ud83d\\ude00"'), headers=JSON
        )  # (a pair is fine)
        assert emoji.status_code == 200, emoji.text
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


def test_a_submit_that_fails_after_its_id_was_claimed_frees_the_id():
    """Past the server's checks (a library caller): the tokenizer's TypeError on a lone surrogate
    propagates, and the request id is free again, with n = 1 and n > 1."""
    executor = guided_executor(dtype="float32")

    async def main():
        async with AsyncExecutor(executor) as engine:
            for n in (1, 3):
                params = SamplingParams(max_tokens=2, n=n)
                bad = Request([{"role": "user", "content": "\ud800"}], params, request_id=f"bad-{n}")
                with pytest.raises(TypeError):
                    async for _ in engine.generate(bad):
                        pass
                assert executor._loop.unfinished_ids() == []
                good = Request(MESSAGES, params, request_id=f"bad-{n}")  # (the id can be used again)
                finished = [e async for e in engine.generate(good) if e.finished]
                assert len(finished) == n and all(e.output.error is None for e in finished)
            assert engine.num_unfinished == 0
            assert_all_pages_free(executor)

    asyncio.run(main())


def test_json_nested_too_deep_is_a_400_anywhere_in_the_body():
    with served() as (base, engine, stack):
        http = stack.enter_context(httpx.Client(base_url=base, timeout=60))
        too_deep = [
            (b"[" * 100_000, None),  # (RecursionError in the parser)
            (b'{"a": ' * 200 + b"1" + b"}" * 200, "a"),  # (parsed, then refused by the walk)
            (raw_chat(f'"response_format": {{"type": "json_schema", "json_schema": {{"name": "x", '
                      f'"schema": {nested_schema(5000)}}}}}'), None),
            (raw_chat('"tools": [{"type": "function", "function": {"name": "f", '
                      f'"parameters": {nested_schema(MAX_JSON_DEPTH)}}}}}], "tool_choice": "required"'),
             "tools"),
        ]  # fmt: skip
        for body, param in too_deep:
            answer = http.post(CHAT, content=body, headers=JSON)
            assert answer.status_code == 400, (body[:80], answer.text[:300])
            error = answer.json()["error"]
            assert "deeper" in error["message"] and error["param"] == param, error
        for path in ("/v1/responses", "/tokenize", "/v1/completions"):
            assert http.post(path, content=b"[" * 100_000, headers=JSON).status_code == 400, path
        # a schema as deep as the bound allows runs, or is refused as a schema: never a 500
        depth = (MAX_JSON_DEPTH - 6) // 2
        for extra in (
            f'"response_format": {{"type": "json_schema", "json_schema": {{"name": "x", '
            f'"schema": {nested_schema(depth)}}}}}',
            f'"tools": [{{"type": "function", "function": {{"name": "f", '
            f'"parameters": {nested_schema(depth)}}}}}], "tool_choice": "required"',
        ):
            answer = http.post(CHAT, content=raw_chat(extra), headers=JSON)
            assert answer.status_code in (200, 400), answer.text[:300]
        wait_until_idle(engine)
        assert engine.executor._loop.unfinished_ids() == []
        assert_all_pages_free(engine.executor)


@contextlib.asynccontextmanager
async def app_client(client_host: str, **options):
    """An httpx client on the app in this process, the requests coming from ``client_host``."""
    executor = guided_executor(dtype="float32", enable_prefix_caching=True)
    engine = AsyncExecutor(executor)
    app = build_app(engine, "tiny", **options)
    transport = httpx.ASGITransport(app=app, client=(client_host, 40000))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as http:
            yield http
    finally:
        await engine.close()


@pytest.mark.parametrize("path", ["/flush_cache", "/reset_prefix_cache"])
def test_the_admin_endpoints_need_the_key_or_a_loopback_client(path):
    async def status(client_host: str, headers=None, **options) -> int:
        async with app_client(client_host, **options) as http:
            return (await http.post(path, headers=headers)).status_code

    async def main():
        assert await status("203.0.113.7") == 403
        assert await status("127.0.0.1") == 200
        assert await status("::1") == 200
        assert await status("::ffff:127.0.0.1") == 200
        assert await status("203.0.113.7", allow_remote_admin=True) == 200
        assert await status("127.0.0.1", api_key="k") == 401  # (with a key, loopback needs it too)
        assert await status("203.0.113.7", {"authorization": "Bearer k"}, api_key="k") == 200
        async with app_client("203.0.113.7") as http:
            refused = (await http.post(path)).json()["error"]
            assert refused["type"] == "permission_error" and "--api-key" in refused["message"]
            assert (await http.get("/health")).status_code == 200  # (the rest of the API is open)

    asyncio.run(main())


def test_a_stored_response_belongs_to_the_key_that_made_it():
    async def main():
        async with app_client("127.0.0.1", api_key=["key-a", "key-b"]) as http:
            a, b = ({"authorization": f"Bearer {k}"} for k in ("key-a", "key-b"))
            made = await http.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 2}, headers=a)
            assert made.status_code == 200, made.text
            response_id = made.json()["id"]
            assert (await http.get(f"/v1/responses/{response_id}", headers=b)).status_code == 404
            assert (await http.delete(f"/v1/responses/{response_id}", headers=b)).status_code == 404
            continued = {"input": "More", "max_output_tokens": 2, "previous_response_id": response_id}
            foreign = await http.post("/v1/responses", json=continued, headers=b)
            unknown = await http.post(
                "/v1/responses", json={**continued, "previous_response_id": "resp_none"}, headers=a
            )
            assert foreign.status_code == unknown.status_code == 400  # (OpenAI's status: as if unknown)
            assert foreign.json()["error"]["param"] == "previous_response_id"
            assert (await http.post("/v1/responses", json=continued, headers=a)).status_code == 200
            assert (await http.get(f"/v1/responses/{response_id}", headers=a)).status_code == 200
            assert (await http.delete(f"/v1/responses/{response_id}", headers=a)).status_code == 200

    asyncio.run(main())
    identity = key_identity(b"key-a")  # (what the store keeps: a digest, never the key)
    assert "key-a" not in identity and identity == key_identity(b"key-a") != key_identity(b"key-b")
