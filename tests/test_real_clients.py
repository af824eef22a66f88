"""Clients people put in front of an OpenAI-compatible server, unchanged, against a real `specexec serve`
on loopback (the tiny model with SmolLM2's tokenizer, 1,024 positions, prefix caching on as `serve` has
it): langchain-openai's ``bind_tools`` and ``with_structured_output`` (function calling and JSON mode).
The `openai` client's own calls are in `test_server.py`."""

from __future__ import annotations

import json

import jsonschema
import langchain_openai  # (the dev extra installs it)
import pytest
from pydantic import BaseModel, Field
from test_server import NGRAM, assert_all_pages_free, long_context_executor, served_engine, wait_until_idle


class Weather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)


@pytest.mark.parametrize("spec", [None, NGRAM], ids=["no-drafts", "ngram"])
def test_langchain_bind_tools_and_structured_output(spec):
    with served_engine(long_context_executor(spec)) as (base, engine, stack):
        llm = langchain_openai.ChatOpenAI(
            base_url=f"{base}/v1", api_key="none", model="tiny", temperature=0, max_tokens=200, max_retries=0
        )
        question = "What is the weather in Paris for the next 3 days?"
        schema = Weather.model_json_schema()  # (bounded strings: the random model stops in time)
        message = llm.bind_tools([Weather], tool_choice="Weather").invoke(question)
        (call,) = message.tool_calls
        assert call["name"] == "Weather"
        jsonschema.validate(call["args"], schema)
        required = llm.bind_tools([Weather], tool_choice="any").invoke(question)
        assert required.tool_calls and all(c["name"] == "Weather" for c in required.tool_calls)
        for c in required.tool_calls:
            jsonschema.validate(c["args"], schema)
        weather = llm.with_structured_output(Weather, method="function_calling").invoke(question)
        assert isinstance(weather, Weather)
        as_json = llm.with_structured_output(method="json_mode").invoke(question + " Answer in JSON.")
        assert isinstance(as_json, dict)
        parsed = llm.with_structured_output(Weather, method="json_schema").invoke(question)
        assert isinstance(parsed, Weather) and json.loads(parsed.model_dump_json())["days"] <= 7
        wait_until_idle(engine)
        assert_all_pages_free(engine.executor)
