"""Clients people put in front of an OpenAI-compatible server, unchanged, against a real `specexec serve`
on loopback (the tiny model with SmolLM2's tokenizer, 1,024 positions, prefix caching on as `serve` has
it): the `openai` client's ``chat.completions.parse``, langchain-openai's ``bind_tools`` and ``with_structured_output`` (function calling, JSON mode and
JSON schema), instructor in its TOOLS and JSON_SCHEMA modes, litellm's chat and tool calls, and
lm-evaluation-harness's ``local-completions`` on a bundled log-likelihood task and a generate_until task
(local JSONL; nothing from the hub), and guidellm's default streamed load. Each runs with NGram drafts
and without (guidellm samples: with drafts only); greedy, the answers are the same. The `openai`
client's other calls are in `test_server.py`.

The dev extra installs every client; a missing one fails here (no skip).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import warnings
from pathlib import Path
from urllib.parse import urlsplit

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no price list from the network
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # lm-eval's `datasets`: local files only
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import instructor  # noqa: E402
import jsonschema  # noqa: E402
import langchain_openai  # noqa: E402
import litellm  # noqa: E402
import openai  # noqa: E402
import pytest  # noqa: E402
from factories import assert_all_pages_free  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402
from served import CLOCK, NGRAM, WEATHER, long_context_executor, served_engine, wait_until_idle  # noqa: E402

QUESTION = "What is the weather in Paris for the next 3 days?"


class Weather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=12)  # (bounded strings: the random model stops in time)
    days: int = Field(ge=1, le=7)


def client_answers(spec) -> dict:
    """Every client's greedy answers from one server, with what each returned checked on the way; then
    nothing the clients opened is left open (`assert_nothing_left_open`)."""
    with served_engine(long_context_executor(spec)) as (base, engine, stack):
        answers = {
            "openai": openai_parse_answer(base, stack),
            "langchain": langchain_answers(base, stack),
            "instructor": instructor_answers(base, stack),
            "litellm": litellm_answers(base, stack),
        }
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)
    assert_nothing_left_open(urlsplit(base).port)
    return answers


def assert_nothing_left_open(port: int) -> None:
    """No socket of this process still connected to the server's ``port``, and no event loop left open on
    the main thread: either would be closed by whichever later test collects it, and reported there as
    that test's ResourceWarning. (langchain and litellm cache their HTTP clients for the process's life
    unless given one; litellm's synchronous calls make the main thread an event loop and never close it.)"""
    assert not sockets_connected_to(port), f"a client's connection to port {port} is still open"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.set_event_loop(None)  # (what asyncio.run does on its way out: a loop left there is dropped)
        gc.collect()
    assert not [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def sockets_connected_to(port: int) -> list[str]:
    """The inodes of this process's open TCP sockets whose remote end is ``port`` on this host."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # (the listing's own descriptor, closed by now)
            continue
        if target.startswith("socket:["):
            mine.add(target[len("socket:[") : -1])
    return sorted(inodes & mine)


def test_openai_parse_langchain_instructor_and_litellm_give_valid_answers_the_same_with_drafts():
    assert client_answers(NGRAM) == client_answers(None)


def openai_parse_answer(base: str, stack) -> dict:
    """The `openai` client's ``chat.completions.parse`` with a Pydantic model (a strict json_schema)."""
    api = stack.enter_context(openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0))
    completion = api.chat.completions.parse(
        model="tiny",
        messages=[{"role": "user", "content": QUESTION}],
        response_format=Weather,
        temperature=0,
        max_tokens=200,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Weather)
    return parsed.model_dump()


def langchain_answers(base: str, stack) -> list:
    """langchain-openai's tool calls and structured output (on an HTTP client the test closes: its own
    would stay in a cache, connected, until the process ends)."""
    llm = langchain_openai.ChatOpenAI(
        base_url=f"{base}/v1",
        api_key="none",
        model="tiny",
        temperature=0,
        max_tokens=200,
        max_retries=0,
        http_client=stack.enter_context(httpx.Client()),
    )
    schema = Weather.model_json_schema()
    message = llm.bind_tools([Weather], tool_choice="Weather").invoke(QUESTION)
    (call,) = message.tool_calls
    assert call["name"] == "Weather"
    jsonschema.validate(call["args"], schema)
    required = llm.bind_tools([Weather], tool_choice="any").invoke(QUESTION)
    assert required.tool_calls and all(c["name"] == "Weather" for c in required.tool_calls)
    for c in required.tool_calls:
        jsonschema.validate(c["args"], schema)
    weather = llm.with_structured_output(Weather, method="function_calling").invoke(QUESTION)
    assert isinstance(weather, Weather)
    as_json = llm.with_structured_output(method="json_mode").invoke(QUESTION + " Answer in JSON.")
    assert isinstance(as_json, dict)
    parsed = llm.with_structured_output(Weather, method="json_schema").invoke(QUESTION)
    assert isinstance(parsed, Weather) and json.loads(parsed.model_dump_json())["days"] <= 7
    calls = [[(c["name"], c["args"]) for c in m.tool_calls] for m in (message, required)]
    return [calls, weather.model_dump(), as_json, parsed.model_dump()]


def instructor_answers(base: str, stack) -> list:
    """instructor's default TOOLS mode (a named tool choice) and its JSON_SCHEMA mode (response_format)."""
    api = stack.enter_context(openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0))
    answers = []
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        patched = instructor.from_openai(api, mode=mode)
        weather = patched.chat.completions.create(
            model="tiny",
            response_model=Weather,
            messages=[{"role": "user", "content": QUESTION}],
            temperature=0,
            max_tokens=200,
            max_retries=1,  # one try: a retry would hide an invalid first answer
        )
        assert isinstance(weather, Weather)
        answers.append(weather.model_dump())
    return answers


def litellm_answers(base: str, stack) -> list:
    """litellm's OpenAI-compatible provider: plain chat and required tool calls. Given an `openai` client
    the test closes (litellm's own stays cached, connected), on an event loop the test closes (its
    synchronous calls take the main thread's, making one if there is none)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    stack.callback(loop.close)
    stack.callback(asyncio.set_event_loop, None)
    api = stack.enter_context(openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0))
    common = dict(
        model="openai/tiny", api_base=f"{base}/v1", api_key="none", temperature=0, num_retries=0, client=api
    )
    chat = litellm.completion(messages=[{"role": "user", "content": "Say hello."}], max_tokens=12, **common)
    text = chat.choices[0].message.content
    assert isinstance(text, str) and chat.usage.completion_tokens <= 12
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}
    called = litellm.completion(
        messages=[{"role": "user", "content": "What is the weather in Paris, and the time in UTC?"}],
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        max_tokens=300,
        **common,
    )
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    calls = []
    for c in choice.message.tool_calls:
        arguments = json.loads(c.function.arguments)
        jsonschema.validate(arguments, schemas[c.function.name])
        calls.append((c.function.name, arguments))
    return [text, calls]


# ---- lm-evaluation-harness ----------------------------------------------------------------------------
LOGLIKELIHOOD_DOCS = [
    {"question": "The capital of France is", "choices": [" Paris", " Rome", " a cat"], "answer": 0},
    {"question": "Two plus two is", "choices": [" four", " five"], "answer": 0},
    {"question": "The sky is", "choices": [" blue", " green", " loud"], "answer": 0},
]
GENERATE_DOCS = [
    {"question": "Question: name a colour.\nAnswer:", "answer": "red"},
    {"question": "Question: name an animal.\nAnswer:", "answer": "cat"},
]


def write_tasks(folder) -> None:
    """Two lm-eval tasks over local JSONL files: multiple choice (log-likelihoods) and generate_until."""
    for name, docs in (("ll", LOGLIKELIHOOD_DOCS), ("gen", GENERATE_DOCS)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    common = (
        "dataset_path: json\n"
        "dataset_kwargs:\n  data_files:\n    test: {path}\n"
        "test_split: test\n"
        'doc_to_text: "{{{{question}}}}"\n'
    )
    (folder / "specexec_ll.yaml").write_text(
        "task: specexec_ll\n" + common.format(path=folder / "ll.jsonl") + "output_type: multiple_choice\n"
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n"
    )
    (folder / "specexec_gen.yaml").write_text(
        "task: specexec_gen\n" + common.format(path=folder / "gen.jsonl") + "output_type: generate_until\n"
        'doc_to_target: "{{answer}}"\n'
        'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 8\n  do_sample: false\n  temperature: 0\n'
        "metric_list:\n  - metric: exact_match\n"
    )


def lm_eval_answers(spec, tmp_path) -> dict:
    """lm-eval's ``local-completions`` over a served executor: each request's log-likelihoods (echo,
    ``max_tokens`` 1, lists of token-id prompts at batch size 2) and generations."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    with served_engine(long_context_executor(spec)) as (base, engine, stack):
        tokenizer_dir = tmp_path / "tokenizer"
        engine.executor.tokenizer.save_pretrained(tokenizer_dir)
        model_args = (
            f"model=tiny,base_url={base}/v1/completions,tokenizer_backend=huggingface,"
            f"tokenizer={tokenizer_dir},tokenized_requests=True,num_concurrent=1,max_retries=1,"
            "max_length=1024"
        )
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=model_args,
            tasks=["specexec_ll", "specexec_gen"],
            task_manager=TaskManager(include_path=str(tmp_path)),
            batch_size=2,
            log_samples=True,
        )
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)
    samples = results["samples"]
    loglikelihoods = [[r[0] for r in s["filtered_resps"]] for s in samples["specexec_ll"]]
    assert len(loglikelihoods) == len(LOGLIKELIHOOD_DOCS)
    for values, doc in zip(loglikelihoods, LOGLIKELIHOOD_DOCS):
        assert len(values) == len(doc["choices"]) and all(v < 0 for v in values)
    generations = [s["filtered_resps"][0] for s in samples["specexec_gen"]]
    assert len(generations) == len(GENERATE_DOCS) and all(isinstance(g, str) for g in generations)
    return {"loglikelihoods": loglikelihoods, "generations": generations}


def test_lm_eval_local_completions_loglikelihood_and_generate_until_the_same_with_drafts(tmp_path):
    write_tasks(tmp_path)
    with_drafts, without = lm_eval_answers(NGRAM, tmp_path), lm_eval_answers(None, tmp_path)
    assert with_drafts["generations"] == without["generations"]
    # scoring a prompt drafts nothing: the same forward, so the same values up to float32 rounding
    for a, b in zip(with_drafts["loglikelihoods"], without["loglikelihoods"]):
        assert a == pytest.approx(b, abs=1e-4)


# ---- guidellm -------------------------------------------------------------------------------------------
def test_guidellm_streams_its_default_requests_without_an_error(tmp_path):
    """guidellm's default chat requests (streamed, with vLLM's ``continuous_usage_stats``, ``ignore_eos``
    and ``max_completion_tokens``) over synthetic prompts, NGram drafts on: every request succeeds with
    the token count asked for (its samples are not greedy, so not compared across drafters)."""
    import shutil
    import subprocess
    import sys

    guidellm = shutil.which("guidellm") or str(Path(sys.executable).parent / "guidellm")
    with served_engine(long_context_executor(NGRAM)) as (base, engine, stack):
        engine.executor.tokenizer.save_pretrained(tmp_path / "tokenizer")
        report = tmp_path / "guidellm.json"
        command = [
            guidellm,
            "run",
            "--backend",
            f"kind=openai_http,target={base}",
            "--profile",
            "kind=synchronous",
            "--constraint",
            "kind=max_requests,count=5",
            "--data",
            "kind=synthetic_text,prompt_tokens=16,output_tokens=8",
            "--tokenizer",
            f"kind=huggingface_auto,model={tmp_path / 'tokenizer'}",
            "--output",
            f"kind=json,path={report}",
            "--disable-console-interactive",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    requests = benchmark["requests"]
    assert len(requests["successful"]) == 5 and not requests["errored"] and not requests["incomplete"]
    for r in requests["successful"]:
        body = json.loads(r["request_args"])["body"]
        assert body["stream"] and body["stream_options"]["continuous_usage_stats"]
        assert r["output_tokens"] == 8, "ignore_eos and max_completion_tokens honoured"
