"""What routers read and call on a replica: vLLM's gauge and counter names on /metrics, the worker
endpoints (tokenize, detokenize, model and server info, cache flush), readiness while the model loads,
and draining: once it begins /health and new requests answer 503 while those in flight finish."""

from __future__ import annotations

import asyncio
import socket

import httpx
import openai
from factories import assert_all_pages_free, free_port
from prometheus_client.parser import text_string_to_metric_families
from served import MESSAGES, NGRAM, served, wait_until_idle
from specexec.server.serve import answering_loading


async def answer_ok(scope, receive, send) -> None:
    """An ASGI app answering every HTTP request 200 ``ok``: the real server's place in the port tests."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def samples_of(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_vllm_names_carry_the_queue_the_kv_usage_and_the_spec_decode_counters():
    with served(NGRAM) as (base, engine, stack):
        body = {"prompt": "one two three " * 6, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        assert httpx.post(f"{base}/v1/completions", json=body).status_code == 200
        wait_until_idle(engine)
        families = samples_of(httpx.get(f"{base}/metrics").text)
        gauges = {
            name: families[name][0]
            for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
        }
        assert all(s.labels == {"model_name": "tiny"} for s in gauges.values())
        assert gauges["vllm:num_requests_running"].value == 0
        bm = engine.executor.block_manager
        usage = (bm.num_blocks - bm.num_free_blocks) / bm.num_blocks
        assert (
            gauges["vllm:kv_cache_usage_perc"].value == usage == 0.0
        )  # (cached pages no one holds are free)
        assert families["vllm:gpu_cache_usage_perc"][0].value == usage
        ours = {s.name: s.value for s in families["specexec:spec_decode_num_draft_tokens"]}
        theirs = {s.name: s.value for s in families["vllm:spec_decode_num_draft_tokens"]}
        assert list(theirs.values()) == list(ours.values()) and list(ours.values())[0] > 0
        generated = families["vllm:generation_tokens"][0]
        assert generated.value == 24 and generated.labels == {"model_name": "tiny"}


def test_worker_endpoints_answer_as_vllm_and_sglang_do():
    with served() as (base, engine, stack):
        tokenizer = engine.executor.tokenizer
        with httpx.Client(base_url=base) as http:
            counted = http.post("/tokenize", json={"model": "tiny", "prompt": "The cat sat"}).json()
            assert counted["tokens"] == tokenizer.encode("The cat sat") and counted["count"] == len(
                counted["tokens"]
            )
            assert counted["max_model_len"] == engine.executor.core.max_model_len
            chat = http.post("/tokenize", json={"messages": MESSAGES}).json()
            answer = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1}).json()
            assert chat["count"] == answer["usage"]["prompt_tokens"]  # the prompt the executor runs
            assert tokenizer.decode(chat["tokens"]).endswith("assistant\n")  # (the generation prompt)
            back = http.post("/detokenize", json={"tokens": counted["tokens"]}).json()
            assert back == {"prompt": "The cat sat"}
            for path, body, param in [
                ("/tokenize", {}, "prompt"),
                ("/tokenize", {"prompt": "a", "messages": MESSAGES}, "prompt"),
                ("/detokenize", {"tokens": [10**9]}, "tokens"),
                ("/detokenize", {"tokens": "1 2"}, "tokens"),
            ]:
                refused = http.post(path, json=body)
                assert refused.status_code == 400 and refused.json()["error"]["param"] == param, body
            for path in ("/get_model_info", "/model_info"):
                info = http.get(path).json()
                assert info["model_path"] == "tiny" and info["is_generation"] is True
            for path in ("/get_server_info", "/server_info"):
                info = http.get(path).json()
                assert info["engine"] == "specexec" and info["enable_prefix_caching"] is True
            http.post("/v1/completions", json={"prompt": "The cat sat on the mat and", "max_tokens": 4})
            wait_until_idle(engine)
            bm = engine.executor.block_manager
            assert bm.num_cached_blocks > 0, "nothing was cached to flush"
            assert http.post("/flush_cache").status_code == 200 and bm.num_cached_blocks == 0
            http.post("/v1/completions", json={"prompt": "The cat sat on the mat and", "max_tokens": 4})
            wait_until_idle(engine)
            assert http.post("/reset_prefix_cache").status_code == 200 and bm.num_cached_blocks == 0
        assert_all_pages_free(engine.executor)


def test_draining_refuses_new_requests_and_finishes_those_in_flight():
    async def main(base, engine):
        api = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        async with api:
            running = asyncio.create_task(
                api.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40, temperature=0)
            )
            while engine.num_unfinished == 0:
                await asyncio.sleep(0.005)
            engine.drain()  # what SIGTERM does first (`serve.py`)
            async with httpx.AsyncClient() as http:
                health = await http.get(f"{base}/health")
            try:
                await api.completions.create(model="tiny", prompt="late", max_tokens=4)
                late = None
            except openai.APIStatusError as exc:
                late = exc
            return await running, health, late

    with served() as (base, engine, stack):
        answer, health, late = asyncio.run(main(base, engine))
        assert answer.usage.completion_tokens == 40 or answer.choices[0].finish_reason == "stop"
        assert health.status_code == 503 and health.json()["status"] == "draining"
        assert health.headers["retry-after"] == "1"
        assert late is not None and late.status_code == 503 and late.response.headers["retry-after"] == "1"
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


def test_the_port_answers_503_loading_while_the_model_loads():
    port = free_port()
    with answering_loading("127.0.0.1", port):
        for path in ("/health", "/v1/models", "/v1/chat/completions"):
            answer = httpx.get(f"http://127.0.0.1:{port}{path}")
            assert answer.status_code == 503 and answer.json()["status"] == "loading", path
            assert answer.headers["retry-after"] == "5"
    with socket.socket() as s:  # the port is free again for the real server
        s.bind(("127.0.0.1", port))


def test_a_routers_grpc_probe_of_a_loading_replica_is_told_http1_and_nothing_is_logged(caplog):
    """sglang-router probes a worker whose /health is not 2xx with gRPC on the same port: an HTTP/2
    preface, which uvicorn logged as an invalid HTTP request on every retry."""
    port = free_port()
    with (
        answering_loading("127.0.0.1", port),
        socket.create_connection(("127.0.0.1", port), timeout=5) as probe,
    ):
        probe.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        answer = b""
        while chunk := probe.recv(1024):
            answer += chunk
        settings, go_away = answer[:9], answer[9:]
        assert settings[3] == 0x4 and go_away[3] == 0x7  # frame types SETTINGS, GOAWAY
        assert int.from_bytes(go_away[-4:], "big") == 0xD  # HTTP_1_1_REQUIRED
        posted = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"messages": MESSAGES})
        assert posted.status_code == 503 and posted.json()["status"] == "loading"
    assert not [r for r in caplog.records if "Invalid HTTP request" in r.getMessage()]


def test_the_real_server_tells_an_http2_probe_to_use_http1_too(caplog):
    """A router whose health check met a draining replica's 503 (or a loading one's, just before the
    real server took its socket) probes gRPC on the port the real server now holds."""
    import threading
    import time

    import uvicorn
    from specexec.server.listener import Http1Protocol

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(answer_ok, port=port, lifespan="off", http=Http1Protocol, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as probe:
            probe.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            answer = b""
            while chunk := probe.recv(1024):
                answer += chunk
        assert answer[3] == 0x4 and answer[12] == 0x7 and int.from_bytes(answer[-4:], "big") == 0xD
        assert httpx.get(f"http://127.0.0.1:{port}/health").text == "ok"
    finally:
        server.should_exit = True
        thread.join(10)
    assert not [r for r in caplog.records if "Invalid HTTP request" in r.getMessage()]


def test_no_connection_is_refused_while_the_loading_answer_hands_the_port_to_the_real_server():
    """Probes that keep connecting across the handover (held here for 0.3 s, longer than it takes) get
    503 loading, then the real server's answer, and never a refused connection: the one listening
    socket passes from one to the other, a connection made in between waits in its backlog."""
    import threading
    import time

    import uvicorn
    from specexec.server.listener import Http1Protocol, listening_socket

    port = free_port()
    sock = listening_socket("127.0.0.1", port)
    statuses: list[bytes] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
                    connection.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    statuses.append(connection.recv(12)[9:12])
            except OSError as exc:  # (ConnectionRefusedError among them)
                failures.append(exc)

    probes = [threading.Thread(target=probe, daemon=True) for _ in range(2)]
    server = uvicorn.Server(
        uvicorn.Config(answer_ok, lifespan="off", http=Http1Protocol, log_level="warning")
    )
    serving = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    try:
        with answering_loading("127.0.0.1", port, sock):
            for thread in probes:
                thread.start()
            while b"503" not in statuses:
                time.sleep(0.01)
        time.sleep(0.3)  # (the model's load is over; the real server is not accepting yet)
        serving.start()
        while b"200" not in statuses[-4:]:
            assert not failures, failures
            time.sleep(0.01)
    finally:
        stop.set()
        for thread in probes:
            thread.join(15)
        server.should_exit = True
        serving.join(10)
        sock.close()
    assert not failures, failures
    assert set(statuses) == {b"503", b"200"}, set(statuses)
