"""Tool calls streamed as generated (`server/tool_stream.py`): fed one piece at a time, the deltas add
up to what the full response reads from the same text (`tools.read_calls`): the same calls with the
same arguments, and the same content around them; a call is announced once, with its name first."""

from __future__ import annotations

import json

import pytest
from specexec.server.tool_stream import ToolCallStream
from specexec.server.tools import read_calls
from specexec.tool_formats.json_calls import value_end
from tool_plans import tool_plan

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}


def streamed(p, text: str, step: int) -> tuple[str, list[tuple[str, dict]]]:
    """(content, calls) as a client joins the deltas of ``text`` fed ``step`` characters at a time."""
    stream = ToolCallStream(p)
    deltas = []
    for i in range(0, len(text), step):
        deltas += stream.feed(text[i : i + step])
    deltas += stream.finish()
    content, calls = "", {}
    for d in deltas:
        if "content" in d:
            content += d["content"]
            continue
        if "id" in d:
            assert d["index"] not in calls and d["function"]["arguments"] == ""
            calls[d["index"]] = [d["function"]["name"], ""]
        calls[d["index"]][1] += d["function"]["arguments"]
    return content, [(name, json.loads(args)) for name, args in (calls[i] for i in sorted(calls))]


GUIDED = '[{"name": "get_weather", "arguments": {"city": "Paris \\"}{", "days": 3}}, {"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}]'
AUTO = (
    'Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    ' and <tool_call>{"name": "nope", "arguments": {}}</tool_call> done <tool'
)


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_guided_calls_stream_their_arguments_and_add_up_to_the_full_read(step):
    p = tool_plan([WEATHER], "required")
    _, want = read_calls(p, GUIDED)
    content, calls = streamed(p, GUIDED, step)
    assert calls == [(c["name"], c["arguments"]) for c in want] and content == ""


def test_guided_arguments_come_in_pieces_as_written():
    stream = ToolCallStream(tool_plan([WEATHER], "required"))
    pieces = [d for i in range(len(GUIDED)) for d in stream.feed(GUIDED[i]) if "id" not in d]
    assert len(pieces) > 20


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_auto_text_streams_as_content_and_each_block_as_a_call_or_content(step):
    p = tool_plan([WEATHER], "auto")
    want_content, want = read_calls(p, AUTO)
    content, calls = streamed(p, AUTO, step)
    assert (
        calls
        == [(c["name"], c["arguments"]) for c in want]
        == [("get_weather", {"city": "Paris", "days": 2})]
    )
    assert content.split() == want_content.split()  # (the full read strips the content's ends)
    assert "nope" in content and content.endswith("<tool")  # an unclosed opener's start, sent at the end


def test_a_possible_opener_is_held_back_until_it_is_not_one():
    stream = ToolCallStream(tool_plan([WEATHER], "auto"))
    assert stream.feed("Hello <tool") == [{"content": "Hello "}]
    assert stream.feed("box!") == [{"content": "<toolbox!"}]


@pytest.mark.parametrize(
    "text, end",
    [
        ('{"a": "}"}', 10),
        ('{"a": [1, {"b": 2}]} tail', 20),
        ('{"a": "\\"', None),
        ("[1, 2", None),
        ("  7,", 3),
    ],
)
def test_value_end_respects_strings_and_nesting(text, end):
    assert value_end(text, 0) == end
