"""Two replicas behind a real router, on loopback: sglang-router (a dev extra; it is the router the
issue's users deploy with SGLang, it routes by cached prefix, retries failed requests on another worker
and re-writes the bodies it forwards). Its cache-aware policy keeps each of 8 multi-turn conversations
on the replica that holds its prefix, where round robin spreads them; with a replica killed mid-run,
every request a retrying client sends completes. The replicas are the tiny model with SmolLM2's
tokenizer (`test_server.served`), prefix caching on, as `specexec serve` has it."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import openai
import pytest
import uvicorn
from factories import assert_all_pages_free, free_port
from guided_runs import guided_executor
from prometheus_client.parser import text_string_to_metric_families
from served import wait_until_idle
from specexec.executor.async_executor import AsyncExecutor
from specexec.server.app import build_app

pytestmark = pytest.mark.slow

TURNS = ["Tell me about cats.", "And dogs?", "Which is friendlier?"]


class Replica:
    """One `specexec serve`-like server in this process, which a test can stop at once."""

    def __init__(self) -> None:
        self.engine = AsyncExecutor(guided_executor(None, dtype="float32", enable_prefix_caching=True))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            build_app(self.engine, "tiny"), host="127.0.0.1", port=self.port, log_level="error"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            assert self.thread.is_alive(), "the replica did not start"
            time.sleep(0.02)

    def counters(self) -> dict[str, float]:
        """Requests finished and prompt tokens looked up / found in the prefix cache, from /metrics."""
        text = httpx.get(f"{self.url}/metrics").text
        out = {}
        for family in text_string_to_metric_families(text):
            if family.name in ("vllm:request_success", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
                out[family.name.removeprefix("vllm:")] = sum(s.value for s in family.samples)
        return out

    def kill(self) -> None:
        """Stop at once, as a crashed process would: connections in flight are dropped."""
        self.server.should_exit = self.server.force_exit = True
        self.thread.join(30)

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.should_exit = True
            self.thread.join(30)


@contextlib.contextmanager
def router(workers: list[Replica], policy: str):
    """sglang-router in front of ``workers``; yields its base URL once it routes."""
    port = free_port()
    command = [
        sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *[w.url for w in workers], "--policy", policy, "--log-level", "error",
        "--health-check-interval-secs", "1", "--worker-startup-check-interval", "1",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
    ]  # fmt: skip
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed when the router is)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                log.seek(0)
                raise AssertionError(f"the router exited: {log.read()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/v1/models", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the router did not come up"
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(30)
        log.close()


@pytest.fixture
def replicas():
    started = [Replica(), Replica()]
    yield started
    for r in started:
        r.stop()


def converse(base: str, workers: list[Replica]) -> tuple[list[list[int]], float]:
    """8 conversations of 3 turns through the router, one request at a time: which replica served each
    turn (by its request counter), and the share of turns 2-3's prompt tokens the prefix cache held."""
    served_by: list[list[int]] = []
    queries = hits = 0
    with openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0) as api:
        for c in range(8):
            messages, path = [], []
            for t, turn in enumerate(TURNS):
                messages.append({"role": "user", "content": f"Conversation {c}. {turn}"})
                before = [w.counters() for w in workers]
                answer = api.chat.completions.create(
                    model="tiny", messages=messages, max_tokens=8, temperature=0
                )
                messages.append({"role": "assistant", "content": answer.choices[0].message.content})
                after = [w.counters() for w in workers]
                (index,) = [
                    i
                    for i, (b, a) in enumerate(zip(before, after))
                    if a["request_success"] > b["request_success"]
                ]
                path.append(index)
                if t > 0:
                    queries += after[index]["prefix_cache_queries"] - before[index]["prefix_cache_queries"]
                    hits += after[index]["prefix_cache_hits"] - before[index]["prefix_cache_hits"]
            served_by.append(path)
    return served_by, hits / queries


def test_cache_aware_routing_keeps_each_conversation_on_the_replica_holding_its_prefix(replicas):
    with router(replicas, "cache_aware") as base:
        aware, aware_cached = converse(base, replicas)
    for r in replicas:
        assert httpx.post(f"{r.url}/flush_cache").status_code == 200
    with router(replicas, "round_robin") as base:
        spread, spread_cached = converse(base, replicas)
    assert all(len(set(path)) == 1 for path in aware), aware
    assert sum(len(set(path)) > 1 for path in spread) >= 4, spread
    assert aware_cached > spread_cached + 0.2, (aware_cached, spread_cached)
    print(f"cache_aware: {aware} cached {aware_cached:.0%}; round_robin: {spread} cached {spread_cached:.0%}")
    for r in replicas:
        assert_all_pages_free(r.engine.executor)


def test_a_replica_killed_mid_run_fails_over_and_every_retried_request_completes(replicas):
    async def main(base: str):
        failures = 0

        async def one(api, i: int) -> str:
            nonlocal failures
            for _ in range(4):
                try:
                    answer = await api.chat.completions.create(
                        model="tiny", messages=[{"role": "user", "content": f"Question {i}?"}], max_tokens=24,
                        temperature=0,
                    )  # fmt: skip
                    return answer.choices[0].message.content
                except (openai.APIStatusError, openai.APIConnectionError):
                    failures += 1
                    await asyncio.sleep(0.5)
            raise AssertionError(f"request {i} failed 4 times")

        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0) as api:
            tasks = [asyncio.create_task(one(api, i)) for i in range(16)]
            while replicas[1].engine.num_unfinished == 0:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(replicas[1].kill)
            answers = await asyncio.gather(*tasks)
        return answers, failures

    with router(replicas, "round_robin") as base:
        answers, failures = asyncio.run(main(base))
        assert len(answers) == 16 and all(isinstance(a, str) for a in answers)
        after = httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        assert after.status_code == 200, "the router still sends requests to the dead replica"
    print(
        f"16 requests with a replica killed mid-run: {failures} failed attempts seen by the client, 0 after retry"
    )
    for r in replicas:  # the killed one's requests were aborted as its server stopped: nothing held
        wait_until_idle(r.engine)
        assert_all_pages_free(r.engine.executor)


def test_the_router_is_installed_as_a_dev_extra():
    import sglang_router  # (pip install -e '.[dev]' brings it: without it this fails, it does not skip)

    assert sglang_router.__name__ == "sglang_router"
