"""Tool calls' parts without a server: the plan of a request's tools (`server/tools.py`), reading calls
from an output (Hermes blocks, guided JSON), and the tools in a prompt (`tool_formats/`)."""

from __future__ import annotations

import json

import pytest
from specexec.executor.engine.inputs import tokenize_prompt
from specexec.server.bad_request import BadRequest
from specexec.server.tools import guided_format, parse_tools, read_calls
from specexec.tool_formats import hermes
from tool_plans import tool_plan

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
NOW = {"type": "function", "function": {"name": "now"}}


def test_hermes_blocks_that_name_a_tool_and_validate_are_calls_the_rest_is_content():
    text = (
        'Sure. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call> then '
        '<tool_call>{"name": "add", "arguments": {"a": "x", "b": 2}}</tool_call>'  # does not validate
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'  # not a tool
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"name": "now", "arguments": "{}"}'  # unterminated, arguments as a JSON string
    )
    content, calls = read_calls(tool_plan([ADD, NOW]), text)
    assert calls == [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", "arguments": {}}]
    assert content.startswith("Sure.") and "nope" in content and "{not json}" in content
    _, one = read_calls(tool_plan([ADD, NOW], parallel=False), text)
    assert one == calls[:1]
    assert read_calls(tool_plan([ADD, NOW], "none"), text) == (text, [])
    assert read_calls(tool_plan([ADD, NOW]), "no calls here") == ("no calls here", [])


def test_a_guided_output_is_the_calls_json():
    required = tool_plan([ADD, NOW], "required")
    calls = [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", "arguments": {}}]
    assert read_calls(required, json.dumps(calls)) == (None, calls)
    assert read_calls(required, '[{"name": "add", "arguments": {"a": 1') == (
        '[{"name": "add", "arguments": {"a": 1',
        [],
    )
    named = parse_tools(
        {"tools": [ADD, NOW], "tool_choice": {"type": "function", "function": {"name": "now"}}}
    )
    assert read_calls(named, '{"name": "now", "arguments": {}}') == (None, [{"name": "now", "arguments": {}}])
    schema = guided_format(named)["json_schema"]["schema"]
    assert schema["properties"]["name"] == {"const": "now"}
    many = guided_format(required)["json_schema"]["schema"]
    assert many["type"] == "array" and len(many["items"]["anyOf"]) == 2
    assert (
        "anyOf" in guided_format(tool_plan([ADD, NOW], "required", parallel=False))["json_schema"]["schema"]
    )
    assert guided_format(tool_plan([ADD, NOW], "auto")) is None


@pytest.mark.parametrize(
    "body",
    [
        {"tools": "x"},
        {"tools": [{"type": "function"}]},
        {"tools": [{"type": "function", "function": {"name": "a b"}}]},
        {"tools": [ADD, ADD]},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
        {"tools": [ADD], "tool_choice": "sometimes"},
        {"tool_choice": "auto"},
    ],
)
def test_bad_tools_are_refused(body):
    with pytest.raises(BadRequest):
        parse_tools(body)


def test_tools_calls_and_results_reach_a_template_that_knows_only_role_and_content():
    from grammar_support import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1 + 2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    text = tokenizer.decode(tokenize_prompt(messages, tokenizer, 49152, [ADD, NOW]))
    assert "Be brief." in text and '"name": "add"' in text and "<tools>" in text
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>' in text
    assert "<tool_response>\n3\n</tool_response>" in text
    roles = [m["role"] for m in hermes.prompt_messages(messages, [ADD])]
    assert roles == ["system", "user", "assistant", "user"]


def test_a_template_that_renders_tools_gets_them_and_the_calls_arguments_as_objects():
    import copy

    from grammar_support import smollm2_tokenizer

    tokenizer = copy.deepcopy(smollm2_tokenizer())
    tokenizer.chat_template = (
        "{% for t in tools %}TOOL:{{ t.function.name }};{% endfor %}"
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
        "{% for c in m.tool_calls or [] %}CALL:{{ c.function.name }}(a={{ c.function.arguments.a }}){% endfor %}"
        "{% endfor %}"
    )
    messages = [
        {"role": "user", "content": "1 + 2?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    text = tokenizer.decode(tokenize_prompt(messages, tokenizer, 49152, [ADD, NOW]))
    assert text == "TOOL:add;TOOL:now;[user]1 + 2?[assistant]CALL:add(a=1)[tool]3"
