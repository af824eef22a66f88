"""`specexec serve`: a real server on 127.0.0.1 (uvicorn in a thread), driven by the official `openai`
client and by httpx; a tiny float32 model with the SmolLM2 tokenizer, so chat templates and JSON
schemas work."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time

import httpx
import jsonschema
import openai
import pytest
import torch
from factories import assert_all_pages_free, schema_format
from guided_runs import PERSON, guided_executor
from prometheus_client.parser import text_string_to_metric_families
from served import (
    CLOCK,
    MESSAGES,
    NGRAM,
    WEATHER,
    client,
    long_context_executor,
    served,
    served_engine,
    wait_until_idle,
)
from specexec import Request, SamplingParams
from specexec.server.app import ServerLimits


def reference_text(prompt, max_tokens: int, spec=None, response_format=None) -> str:
    executor = guided_executor(spec, dtype="float32")
    params = SamplingParams(max_tokens=max_tokens)
    return executor.run([Request(prompt, params, response_format=response_format)])[0].text


@pytest.mark.parametrize("spec", [None, NGRAM], ids=["no-drafts", "ngram"])
def test_greedy_through_the_server_equals_executor_run_streamed_or_not(spec):
    want_chat = reference_text(MESSAGES, 12, spec)
    want_text = reference_text("The cat sat on the", 12, spec)
    with served(spec) as (base, engine, stack):
        api = stack.enter_context(client(base))
        chat = api.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
        assert chat.choices[0].message.content == want_chat and chat.choices[0].message.role == "assistant"
        usage = chat.usage
        assert (
            0 < usage.completion_tokens <= 12
            and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        )
        stream = api.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want_chat
        assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == chat.choices[0].finish_reason
        done = api.completions.create(model="tiny", prompt="The cat sat on the", max_tokens=12, temperature=0)
        assert done.choices[0].text == want_text
        streamed = api.completions.create(
            model="tiny", prompt="The cat sat on the", max_tokens=12, temperature=0, stream=True
        )
        assert "".join(c.choices[0].text for c in streamed) == want_text
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


def test_json_schema_outputs_validate():
    rf = schema_format(PERSON, "t")
    with served(NGRAM) as (base, _, stack):
        api = stack.enter_context(client(base))
        outs = [
            api.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": f"Pet {i} as JSON"}],
                max_tokens=60,
                temperature=1,
                seed=i,
                response_format=rf,
            )
            for i in range(4)
        ]
    finished = [o for o in outs if o.choices[0].finish_reason == "stop"]
    assert finished, "no guided output finished: nothing was checked"
    for out in finished:
        jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)


def test_bad_requests_get_400_naming_the_field_and_a_wrong_key_401():
    with served(api_key="secret") as (base, engine, stack):
        api = stack.enter_context(client(base, "secret"))
        cases = [
            ({"messages": MESSAGES, "tools": [{"type": "retrieval"}]}, "tools"),
            ({"messages": MESSAGES, "temperature": -1}, "temperature"),
            ({"messages": MESSAGES, "n": 0}, "n"),
            ({"messages": []}, "messages"),
            (
                {
                    "messages": MESSAGES,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"schema": {"type": "nonsense"}},
                    },
                },
                None,
            ),
        ]
        for body, param in cases:
            with pytest.raises(openai.BadRequestError) as err:
                api.chat.completions.create(model="tiny", **body)
            assert err.value.status_code == 400
            if param is not None:
                assert err.value.body["param"] == param, (body, err.value.body)
        with pytest.raises(openai.NotFoundError):
            api.chat.completions.create(model="other", messages=MESSAGES)
        with pytest.raises(openai.AuthenticationError):
            stack.enter_context(client(base, "wrong")).models.list()
        assert [m.id for m in api.models.list()] == ["tiny"]
        assert (
            httpx.post(
                f"{base}/v1/completions", content=b"{not json", headers={"authorization": "Bearer secret"}
            ).status_code
            == 400
        )
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


def test_32_concurrent_streams_mixing_guided_sampled_and_greedy_with_drafts_and_bad_requests():
    want = reference_text(MESSAGES, 16, NGRAM)

    async def main(base):
        api = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        async with api:
            return await asyncio.gather(*(one(api, i) for i in range(32)))

    async def one(api, i: int):
        kind = ("greedy", "sampled", "guided", "bad")[i % 4]
        options = {"max_tokens": 16, "temperature": 0}
        if kind == "sampled":
            options.update(temperature=1.0, seed=i)
        if kind == "guided":
            options.update(max_tokens=60, temperature=1.0, seed=i, response_format=schema_format(PERSON, "t"))
        if kind == "bad":
            options.update(top_p=5)
        try:
            stream = await api.chat.completions.create(
                model="tiny", messages=MESSAGES, stream=True, **options
            )
            async with stream:
                text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        except openai.BadRequestError as exc:
            return kind, exc.status_code
        return kind, text

    with served(NGRAM) as (base, engine, stack):
        results = asyncio.run(main(base))
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)
        assert engine.executor.speculation.stats.num_draft_tokens > 0
    for kind, result in results:
        if kind == "greedy":
            assert result == want
        elif kind == "bad":
            assert result == 400
        elif kind == "guided" and result.endswith("}"):
            with contextlib.suppress(json.JSONDecodeError):
                jsonschema.validate(json.loads(result), PERSON)
        else:
            assert isinstance(result, str)


def test_a_client_that_disconnects_mid_stream_frees_its_pages_at_once():
    with served() as (base, engine, stack):
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 200, "temperature": 0, "stream": True}
        with (
            httpx.Client() as http,
            http.stream("POST", f"{base}/v1/chat/completions", json=body) as response,
        ):
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            assert engine.num_unfinished == 1
        wait_until_idle(engine, 2.0)
        assert_all_pages_free(engine.executor)


def test_the_queue_limit_answers_503_with_retry_after():
    """The first request is held unfinished (the loop paused), so the second finds the queue full
    whatever the machine's speed."""
    with served(limits=ServerLimits(max_queued_requests=1)) as (base, engine, stack):
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 20, "temperature": 0}
        with httpx.Client(timeout=30) as http:
            with engine.executor._loop.exclusive():  # no step runs: the first request stays queued
                first = threading.Thread(
                    target=http.post, args=(f"{base}/v1/chat/completions",), kwargs={"json": body}
                )
                first.start()
                deadline = time.monotonic() + 10
                while engine.num_unfinished == 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
                refused = http.post(f"{base}/v1/chat/completions", json=body)
            first.join(30)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        wait_until_idle(engine, 2.0)


def test_metrics_parse_and_count_the_requests_sent():
    with served(NGRAM) as (base, _, stack):
        api = stack.enter_context(client(base))
        outs = [
            api.completions.create(model="tiny", prompt=f"cat dog cat dog {i}", max_tokens=8, temperature=0)
            for i in range(3)
        ]
        with pytest.raises(openai.BadRequestError):
            api.completions.create(model="tiny", prompt=[10**9], max_tokens=2)
        text = httpx.get(f"{base}/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    by_reason = {
        dict(k[1]).get("finished_reason"): v
        for k, v in samples.items()
        if k[0] == "specexec:request_success_total"
    }
    assert by_reason.get("stop", 0) + by_reason.get("length", 0) == 3 and by_reason["error"] == 1
    assert samples[("specexec:generation_tokens_total", ())] == sum(o.usage.completion_tokens for o in outs)
    assert samples[("specexec:prompt_tokens_total", ())] >= sum(o.usage.prompt_tokens for o in outs)
    drafted = samples[("specexec:spec_decode_num_draft_tokens_total", ())]
    accepted = samples[("specexec:spec_decode_num_accepted_tokens_total", ())]
    per_pos = sum(
        v for k, v in samples.items() if k[0] == "specexec:spec_decode_num_accepted_tokens_per_pos_total"
    )
    assert drafted >= accepted == per_pos
    assert samples[("specexec:time_to_first_token_seconds_count", ())] == 3
    assert samples[("specexec:num_requests_running", ())] == 0


@pytest.mark.parametrize("ranks", [1, 2], ids=["one-process", "tensor-parallel-2"])
def test_sigterm_stops_taking_requests_finishes_the_running_one_and_exits(tmp_path, ranks):
    """... and with tensor parallelism, leaves none of its worker processes behind."""
    import signal
    import subprocess
    import sys

    from tiny_models import save_tiny_model_dir

    path = save_tiny_model_dir(tmp_path / "tiny")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "specexec",
        "serve",
        "--model",
        path,
        "--dtype",
        "float32",
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(ranks),
    ]
    # (shutting down does not depend on the C++ kernels, and in the full suite this process spent
    # about 35 s on loading them: torch's ops run)
    env = {**os.environ, "SPECEXEC_CPU_KERNELS": "0"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.communicate()[1]
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        with open(f"/proc/{process.pid}/task/{process.pid}/children") as f:
            children = [int(pid) for pid in f.read().split()]
        if ranks > 1:
            assert len(children) >= ranks, children  # its workers (and multiprocessing's tracker)
        body = {"model": "tiny", "prompt": "w1 w2 w3", "max_tokens": 60, "temperature": 0, "stream": True}
        with (
            httpx.Client(timeout=60) as http,
            http.stream("POST", f"{base}/v1/completions", json=body) as response,
        ):
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            process.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]", "the running request was cut off"
        assert sum(1 for line in rest if line.startswith("data: {")) >= 1
        assert process.wait(60) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{base}/health")
        from tensor_parallel_runs import no_workers_left

        assert no_workers_left(children), "a worker outlived the server"
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


def test_n_logprobs_and_penalties_through_the_server():
    executor_params = SamplingParams(max_tokens=10, frequency_penalty=1.5, presence_penalty=0.5)
    want = guided_executor(NGRAM, dtype="float32").run([Request(MESSAGES, executor_params)])[0].text
    with served(NGRAM) as (base, engine, stack):
        api = stack.enter_context(client(base))
        penalized = api.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=10,
            temperature=0,
            frequency_penalty=1.5,
            presence_penalty=0.5,
        )
        assert penalized.choices[0].message.content == want
        two = api.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=8,
            temperature=1,
            seed=3,
            n=2,
            logprobs=True,
            top_logprobs=2,
        )
        assert [c.index for c in two.choices] == [0, 1]
        assert two.usage.completion_tokens == sum(len(c.logprobs.content) for c in two.choices)
        for c in two.choices:
            assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in c.logprobs.content)
        done = api.completions.create(model="tiny", prompt="The cat", max_tokens=6, temperature=0, logprobs=3)
        lp = done.choices[0].logprobs
        assert (
            len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == done.usage.completion_tokens
        )
        assert "".join(lp.tokens) == done.choices[0].text
        stream = api.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=6, temperature=1, seed=5, n=2, stream=True
        )
        chunks = [c for c in stream if c.choices]
        finishes = {c.choices[0].index for c in chunks if c.choices[0].finish_reason}
        assert finishes == {0, 1}
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


def test_a_request_past_its_timeout_is_aborted_with_504_and_its_pages_freed():
    """The timeout counts from the request's arrival (it once restarted at the first token, and a
    0.5 s request slipped under a 0.3 s timeout): 256 tokens of the tiny model take ~0.5 s."""
    with served(limits=ServerLimits(request_timeout_s=0.1)) as (base, engine, _):
        body = {
            "model": "tiny",
            "messages": MESSAGES,
            "max_tokens": 5000,
            "temperature": 0,
            "ignore_eos": True,
        }
        slow = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
        assert slow.status_code == 504 and slow.json()["error"]["type"] == "timeout_error"
        with httpx.stream(
            "POST", f"{base}/v1/chat/completions", json={**body, "stream": True}, timeout=30
        ) as r:
            lines = [line for line in r.iter_lines() if line]
        assert "timeout_error" in lines[-1] and "[DONE]" not in lines[-1]
        wait_until_idle(engine, 2.0)
        assert_all_pages_free(engine.executor)


@pytest.mark.parametrize("spec", [None, NGRAM], ids=["no-drafts", "ngram"])
def test_a_client_closing_its_stream_after_the_first_chunk_leaves_no_traceback(spec, capfd):
    """The `openai` client reads one chunk and closes the stream: the request is aborted, every page is
    freed, and the server logs nothing (it once logged "aclose(): asynchronous generator is already
    running" from the stream's clean-up)."""
    with served(spec) as (base, engine, stack):
        api = stack.enter_context(client(base))
        for endpoint in ("chat", "completions"):
            args = dict(model="tiny", max_tokens=300, temperature=0, stream=True)
            if endpoint == "chat":
                stream = api.chat.completions.create(messages=MESSAGES, **args)
            else:
                stream = api.completions.create(prompt="The cat sat on the", **args)
            next(iter(stream))
            stream.close()
            wait_until_idle(engine, 5.0)
            assert_all_pages_free(engine.executor)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "already running" not in err, err[-3000:]


def test_fields_real_clients_send_are_honoured():
    """role developer (= system), logit_bias, user, metadata, stream_options' continuous_usage_stats and
    include_obfuscation; a name the chat template does not render, bad metadata and a bias outside the
    vocabulary are 400s naming the field; error codes are strings or null."""
    system = [{"role": "system", "content": "Answer briefly."}, *MESSAGES]
    developer = [{"role": "developer", "content": "Answer briefly."}, *MESSAGES]
    with served(NGRAM) as (base, engine, stack):
        api = stack.enter_context(client(base))
        args = dict(model="tiny", max_tokens=10, temperature=0)
        want = api.chat.completions.create(messages=system, **args).choices[0].message.content
        got = api.chat.completions.create(messages=developer, user="u-1", metadata={"k": "v"}, **args)
        assert got.choices[0].message.content == want
        # logit_bias: ban the greedy first token, then force one token everywhere
        first = api.completions.create(prompt="The cat sat on the", logprobs=0, **args).choices[0]
        banned = engine.executor.tokenizer.convert_tokens_to_ids(first.logprobs.tokens[0])
        if banned is None or banned == engine.executor.tokenizer.unk_token_id:
            banned = engine.executor.tokenizer.encode(first.logprobs.tokens[0])[0]
        biased = api.completions.create(prompt="The cat sat on the", logit_bias={str(banned): -100}, **args)
        ids = engine.executor.tokenizer.encode(biased.choices[0].text)
        assert biased.choices[0].text != first.text and banned not in ids[:1]
        forced = api.completions.create(prompt="The cat sat on the", logit_bias={"42": 100}, **args)
        assert forced.choices[0].text == engine.executor.tokenizer.decode([42] * 10)
        chunks = list(
            api.chat.completions.create(
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True, "include_obfuscation": True},
                extra_body={"stream_options": {"continuous_usage_stats": True, "include_obfuscation": True}},
                **args,
            )
        )
        with_usage = [c for c in chunks if c.choices and c.usage is not None]
        assert with_usage and with_usage[-1].usage.completion_tokens == 10
        counts = [c.usage.completion_tokens for c in with_usage]
        assert counts == sorted(counts) and with_usage[0].usage.prompt_tokens > 0
        assert all(getattr(c, "obfuscation", None) for c in with_usage)
        cases = [
            ({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "messages"),
            ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
            ({"messages": MESSAGES, "metadata": {"k": 1}}, "metadata"),
            ({"messages": MESSAGES, "logit_bias": {"x": 1}}, "logit_bias"),
            ({"messages": MESSAGES, "logit_bias": {"1": 101}}, "logit_bias"),
            ({"messages": MESSAGES, "user": 7}, "user"),
            ({"messages": MESSAGES, "stream_options": {"nope": True}, "stream": True}, "stream_options"),
        ]
        with httpx.Client() as http:
            for body, param in cases:
                answer = http.post(f"{base}/v1/chat/completions", json={"model": "tiny", **body})
                assert answer.status_code == 400, body
                error = answer.json()["error"]
                assert error["param"] == param and error["code"] is None, (body, error)
            outside = http.post(
                f"{base}/v1/chat/completions",
                json={"model": "tiny", "messages": MESSAGES, "logit_bias": {"999999": 5}},
            )
            assert outside.status_code == 400 and "logit_bias" in outside.json()["error"]["message"]
            missing = http.post(f"{base}/v1/chat/completions", json={"model": "other", "messages": MESSAGES})
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_with_logprobs_scores_the_prompt_as_an_hf_forward(max_tokens):
    """lm-evaluation-harness's log-likelihood request (`local-completions`): several token-id prompts in
    one request, ``echo``, ``logprobs: 1``, ``max_tokens`` 0 or 1: each choice lists the prompt's tokens
    with the model's log-probabilities (the first null) before what it generated, as an HF forward's
    log-softmax gives them (float32)."""
    from guided_runs import VOCAB
    from tiny_models import make_tiny_model

    reference, _ = make_tiny_model("llama", vocab_size=VOCAB)
    reference = reference.float()
    prompts = [[101, 202, 303, 404, 505, 606], [7, 8, 9, 7, 8, 9, 7, 8], [1500, 40]]
    with served(NGRAM) as (base, engine, stack):
        api = stack.enter_context(client(base))
        answer = api.completions.create(
            model="tiny", prompt=prompts, echo=True, logprobs=1, max_tokens=max_tokens, temperature=0
        )
        tokenizer = engine.executor.tokenizer
        assert [c.index for c in answer.choices] == [0, 1, 2]
        for prompt, choice in zip(prompts, answer.choices):
            logprobs = choice.logprobs
            assert len(logprobs.tokens) == len(prompt) + max_tokens
            assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
            with torch.no_grad():
                want = torch.log_softmax(reference(torch.tensor([prompt])).logits[0].double(), dim=-1)
            for p in range(len(prompt) - 1):
                assert logprobs.token_logprobs[p + 1] == pytest.approx(
                    want[p, prompt[p + 1]].item(), abs=1e-4
                )
                best = int(want[p].argmax())
                assert list(logprobs.top_logprobs[p + 1]) == [tokenizer.decode([best])]
            assert choice.text.startswith(tokenizer.decode(prompt))
        assert answer.usage.prompt_tokens == sum(map(len, prompts))
        assert answer.usage.completion_tokens == max_tokens * len(prompts)
        # vLLM's prompt_logprobs on a text prompt, and the refusals
        text = api.completions.create(
            model="tiny", prompt="The cat sat", max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 2}
        )
        entries = text.choices[0].model_extra["prompt_logprobs"]
        assert entries[0] is None and all(1 <= len(e) <= 3 for e in entries[1:])
        # echo streamed: the prompt's text first, then the completion, as the full response has it
        args = dict(model="tiny", max_tokens=6, temperature=0)
        for prompt in ("The cat sat", prompts[0]):
            whole = api.completions.create(prompt=prompt, echo=True, **args).choices[0].text
            chunks = list(api.completions.create(prompt=prompt, echo=True, stream=True, **args))
            assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
            assert chunks[0].choices[0].text == (
                prompt if isinstance(prompt, str) else tokenizer.decode(prompt)
            )
        with httpx.Client() as http:
            for body, param in [
                ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
                ({"prompt": "x", "echo": True, "logprobs": 1, "stream": True}, "echo"),
                ({"prompt": ["a", "b"], "stream": True}, "prompt"),
                ({"prompt": "x", "echo": "yes"}, "echo"),
            ]:
                refused = http.post(f"{base}/v1/completions", json={"model": "tiny", **body})
                assert refused.status_code == 400 and refused.json()["error"]["param"] == param, body
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


def joined_calls(chunks) -> list[tuple[str, str]]:
    """A streamed answer's calls, as a client joins OpenAI's deltas: per index, the name of the first
    delta and every delta's arguments piece in order."""
    calls: dict[int, list[str]] = {}
    for chunk in chunks:
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            name, pieces = calls.setdefault(tc.index, [tc.function.name, ""])
            if tc.function.name is not None:
                assert tc.id is not None and tc.type == "function" and pieces == ""
            calls[tc.index][1] += tc.function.arguments or ""
    return [(name, arguments) for name, arguments in (calls[i] for i in sorted(calls))]


def calls_of(choice) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]


def test_tool_calls_required_and_named_parse_validate_and_equal_with_drafts():
    """The openai client's function calling: with tool_choice required (parallel or not) and a named
    function every returned call names a tool and its arguments validate; greedy calls are the same
    with NGram drafts as without; streamed, the calls come in one delta; the history's calls and tool
    results go through the template; bad tools are 400s naming the field."""
    assert tool_call_answers(NGRAM) == tool_call_answers(None)


def tool_call_answers(spec) -> dict:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}
    ask = [{"role": "user", "content": "What is the weather in Paris for 3 days, and the time in UTC?"}]
    answers = {}
    with served_engine(long_context_executor(spec)) as (base, engine, stack):
        api = stack.enter_context(client(base))
        args = dict(model="tiny", messages=ask, tools=[WEATHER, CLOCK], temperature=0, max_tokens=600)
        for name, choice, parallel in [
            ("required", "required", True),
            ("required-one", "required", False),
            ("named", {"type": "function", "function": {"name": "get_time"}}, True),
        ]:
            answer = api.chat.completions.create(tool_choice=choice, parallel_tool_calls=parallel, **args)
            (only,) = answer.choices
            assert only.finish_reason == "tool_calls", (name, only)
            calls = calls_of(only)
            assert calls and (parallel or len(calls) == 1)
            for function, arguments in calls:
                jsonschema.validate(arguments, schemas[function])
            if name == "named":
                assert {f for f, _ in calls} == {"get_time"}
            answers[name] = calls
        chunks = list(api.chat.completions.create(tool_choice="required", stream=True, **args))
        assert [(f, json.loads(a)) for f, a in joined_calls(chunks)] == answers["required"]
        pieces = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        assert len(pieces) > 2 * len(answers["required"]), "the arguments did not stream as generated"
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        # a second turn: the assistant's calls and the tools' results in the history
        first = api.chat.completions.create(tool_choice="required", **args).choices[0].message
        history = ask + [
            {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in first.tool_calls]},
            *({"role": "tool", "tool_call_id": c.id, "content": '{"ok": true}'} for c in first.tool_calls),
        ]
        again = api.chat.completions.create(
            model="tiny",
            messages=history,
            tools=[WEATHER, CLOCK],
            tool_choice="none",
            temperature=0,
            max_tokens=8,
        )
        assert again.choices[0].message.tool_calls is None and again.choices[0].message.content is not None
        with httpx.Client() as http:
            for body, param in [
                ({"tool_choice": "required"}, "tool_choice"),
                (
                    {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                    "tool_choice",
                ),
                ({"tools": [WEATHER, WEATHER]}, "tools"),
                ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
                ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
                (
                    {
                        "tools": [WEATHER],
                        "tool_choice": "required",
                        "response_format": {"type": "json_object"},
                    },
                    "tool_choice",
                ),
            ]:
                refused = http.post(
                    f"{base}/v1/chat/completions", json={"model": "tiny", "messages": ask, **body}
                )
                assert refused.status_code == 400 and refused.json()["error"]["param"] == param, body
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)
        if spec is not None:  # speculation stayed on: the forced and NGram drafts were verified
            assert engine.executor.speculation.stats.num_draft_tokens > 0
    return answers


@pytest.mark.parametrize("spec", [None, NGRAM], ids=["no-drafts", "ngram"])
def test_a_second_turn_reuses_the_first_turns_pages(spec):
    """Multi-turn chat: the second turn's prompt starts with the first turn and its answer, whose pages
    are cached: usage says how many prompt tokens came from the cache (OpenAI's cached_tokens), /metrics
    counts them (vLLM's prefix_cache_queries/_hits), and the answer is the one computed in full."""
    turn = [{"role": "user", "content": "Tell me about the history of cats and dogs living together."}]
    with served(spec) as (base, engine, stack):
        api = stack.enter_context(client(base))
        args = dict(model="tiny", temperature=0, max_tokens=16)
        first = api.chat.completions.create(messages=turn, **args)
        second_turn = turn + [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And then?"},
        ]
        second = api.chat.completions.create(messages=second_turn, **args)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert 0 < cached < second.usage.prompt_tokens and cached % 8 == 0
        assert second.choices[0].message.content == reference_text(second_turn, 16, spec)
        families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{base}/metrics").text)}
        hits = families["specexec:prefix_cache_hits"].samples[0].value
        queries = families["specexec:prefix_cache_queries"].samples[0].value
        assert hits == cached and queries == first.usage.prompt_tokens + second.usage.prompt_tokens
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)
