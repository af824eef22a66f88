"""The Responses API (`server/responses_api.py`) through the `openai` client's ``responses`` methods:
text and message input with instructions give the chat path's greedy answer (drafts on and off),
``previous_response_id`` continues a stored conversation, ``text.format`` JSON schemas are followed,
tools come back as ``function_call`` items and their outputs go back in, the stream's events add up to
the response, and what is not supported is a 400 naming the field."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import jsonschema
import openai
import pytest
from factories import assert_all_pages_free
from guided_runs import PERSON
from pydantic import Field
from served import (
    MESSAGES,
    NGRAM,
    WEATHER,
    client,
    long_context_executor,
    served,
    served_engine,
    wait_until_idle,
)

GREEDY = {"model": "tiny", "temperature": 0, "max_output_tokens": 16}
TOOL = {"type": "function", **WEATHER["function"]}  # the Responses API's flat shape


def chat_text(api, messages, max_tokens=16) -> str:
    answer = api.chat.completions.create(
        model="tiny", messages=messages, max_tokens=max_tokens, temperature=0
    )
    return answer.choices[0].message.content


@pytest.mark.parametrize("spec", [None, NGRAM], ids=["no-drafts", "ngram"])
def test_text_and_message_input_give_the_chat_answer(spec):
    with served(spec) as (base, engine, stack):
        api = stack.enter_context(client(base))
        want = chat_text(api, [{"role": "system", "content": "Be brief."}, *MESSAGES])
        by_text = api.responses.create(input=MESSAGES[0]["content"], instructions="Be brief.", **GREEDY)
        parts = [{"type": "input_text", "text": MESSAGES[0]["content"]}]
        by_items = api.responses.create(
            input=[{"role": "user", "content": parts}], instructions="Be brief.", **GREEDY
        )
        assert by_text.output_text == by_items.output_text == want
        assert by_text.status in ("completed", "incomplete") and by_text.output[0].type == "message"
        assert 0 < by_text.usage.output_tokens <= 16
        assert by_text.usage.total_tokens == by_text.usage.input_tokens + by_text.usage.output_tokens
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


def test_previous_response_id_continues_the_stored_conversation():
    with served() as (base, engine, stack):
        api = stack.enter_context(client(base))
        first = api.responses.create(input="Name a colour.", **GREEDY)
        second = api.responses.create(input="And another?", previous_response_id=first.id, **GREEDY)
        history = [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And another?"},
        ]
        assert second.output_text == chat_text(api, history)
        assert second.previous_response_id == first.id
        assert api.responses.retrieve(second.id).output_text == second.output_text
        api.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            api.responses.retrieve(first.id)
        with pytest.raises(openai.BadRequestError) as err:
            api.responses.create(input="Again?", previous_response_id=first.id, **GREEDY)
        assert err.value.body["param"] == "previous_response_id"
        unstored = api.responses.create(input="Name a colour.", store=False, **GREEDY)
        with pytest.raises(openai.NotFoundError):
            api.responses.retrieve(unstored.id)


def test_a_json_schema_format_is_followed():
    with served() as (base, engine, stack):
        api = stack.enter_context(client(base))
        text = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
        for seed in range(3):
            answer = api.responses.create(
                model="tiny", input=f"Describe pet {seed} as JSON.", text=text, temperature=1.0, max_output_tokens=60
            )  # fmt: skip
            assert answer.status == "completed", answer.incomplete_details
            jsonschema.validate(json.loads(answer.output_text), PERSON)
        assert answer.text.format.type == "json_schema"


def test_a_required_tool_comes_back_as_a_function_call_and_its_output_goes_back_in():
    with served_engine(long_context_executor(None)) as (base, engine, stack):
        api = stack.enter_context(client(base))
        called = api.responses.create(
            model="tiny", input="Weather in Paris?", tools=[TOOL], tool_choice="required", temperature=0,
            max_output_tokens=600,
        )  # fmt: skip
        calls = [item for item in called.output if item.type == "function_call"]
        assert calls and calls[0].name == "get_weather" and calls[0].call_id
        jsonschema.validate(json.loads(calls[0].arguments), TOOL["parameters"])
        outputs = [
            {"type": "function_call_output", "call_id": c.call_id, "output": '{"sky": "clear"}'}
            for c in calls
        ]
        greedy = {k: v for k, v in GREEDY.items() if k != "model"}
        follow = api.responses.create(
            model="tiny", previous_response_id=called.id, input=outputs, tools=[TOOL], **greedy
        )
        assert follow.output[0].type == "message"
        # the same conversation sent whole, as items, gives the same answer
        asked = [{"role": "user", "content": "Weather in Paris?"}]
        made = [
            {"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments}
            for c in calls
        ]
        whole = api.responses.create(model="tiny", input=asked + made + outputs, tools=[TOOL], **greedy)
        assert whole.output_text == follow.output_text
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


@pytest.mark.parametrize("with_tools", [False, True], ids=["text", "tools"])
def test_the_stream_adds_up_to_the_response(with_tools):
    with served_engine(long_context_executor(NGRAM)) as (base, engine, stack):
        api = stack.enter_context(client(base))
        args = dict(input="Weather in Paris?", **GREEDY)
        if with_tools:
            args.update(tools=[TOOL], tool_choice="required", max_output_tokens=600)
        whole = api.responses.create(**args)
        events = list(api.responses.create(stream=True, **args))
        kinds = [e.type for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[-1] in ("response.completed", "response.incomplete")
        assert [e.sequence_number for e in events] == list(range(len(events)))
        final = events[-1].response
        assert [i.type for i in final.output] == [i.type for i in whole.output]
        if with_tools:
            assert final.status == "completed"  # (the calls' JSON ends by itself: the helper runs below)
            done = [e for e in events if e.type == "response.function_call_arguments.done"]
            assert [d.arguments for d in done] == [
                i.arguments for i in whole.output if i.type == "function_call"
            ]
        else:
            deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert deltas == final.output_text == whole.output_text
            assert sum(k == "response.output_text.delta" for k in kinds) > 1, "the text came in one piece"
        if final.status == "completed":  # (the client's helper takes only response.completed as an end)
            with api.responses.stream(**args) as stream:  # its own accumulation agrees
                assert stream.get_final_response().output_text == whole.output_text
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)


def test_a_response_cut_by_max_output_tokens_is_incomplete():
    with served() as (base, engine, stack):
        api = stack.enter_context(client(base))
        answer = api.responses.create(
            model="tiny", input="Count to a hundred.", temperature=0, max_output_tokens=3
        )
        assert answer.usage.output_tokens == 3  # (the tiny model never stops this early)
        assert answer.status == "incomplete" and answer.incomplete_details.reason == "max_output_tokens"


def test_a_field_no_engine_here_knows_is_ignored_and_unasked_reasoning_is_fine():
    with served() as (base, engine, stack):
        api = stack.enter_context(client(base))
        extra = {"prompt_cache_key": "k1", "some_future_field": {"a": 1}, "reasoning": {"effort": None}}
        answer = api.responses.create(input="hi", extra_body=extra, **GREEDY)
        assert answer.output_text == api.responses.create(input="hi", **GREEDY).output_text


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "hi", "background": True}, "background"),
        ({"input": "hi", "conversation": "c1"}, "conversation"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input"),
        ({"input": ""}, "input"),
        ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text"),
    ],
)
def test_what_is_not_supported_is_a_400_naming_the_field(body, param):
    with served() as (base, engine, stack):
        api = stack.enter_context(client(base))
        with pytest.raises(openai.BadRequestError) as err:
            api.responses.create(model="tiny", **body)
        assert err.value.body["param"] == param


def agent_run(spec) -> tuple[list[str], str]:
    """The openai-agents SDK's tool-using agent against the server (its Responses model, the SDK's
    default): the calls its tool got and the run's final output (the tool's answer: the agent stops
    at its first tool call, since the tiny model's free text never ends)."""
    import agents  # (openai-agents, a dev extra)

    calls: list[str] = []

    @agents.function_tool  # (bounded arguments: a random model's guided JSON ends within the budget)
    def get_weather(
        city: Annotated[str, Field(max_length=12)], days: Annotated[int, Field(ge=1, le=7)]
    ) -> str:
        """The weather in a city."""
        calls.append(f"{city}/{days}")
        return f"clear in {city!r} for {days} days"

    async def main(base: str):
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0) as api:
            agent = agents.Agent(
                name="weather",
                instructions="Answer with the weather tool.",
                tools=[get_weather],
                model=agents.OpenAIResponsesModel("tiny", api),
                model_settings=agents.ModelSettings(
                    temperature=0, tool_choice="required", parallel_tool_calls=False, max_tokens=600
                ),
                tool_use_behavior="stop_on_first_tool",
            )
            return await agents.Runner.run(agent, "Weather in Paris for 2 days?", max_turns=3)

    agents.set_tracing_disabled(True)
    with served_engine(long_context_executor(spec)) as (base, engine, stack):
        result = asyncio.run(main(base))
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)
    return calls, result.final_output


def test_an_openai_agents_sdk_agent_calls_its_tool_the_same_with_drafts_and_without():
    calls, answer = agent_run(None)
    assert calls and answer == f"clear in {calls[0].split('/')[0]!r} for {calls[0].split('/')[1]} days"
    assert agent_run(NGRAM) == (calls, answer)
