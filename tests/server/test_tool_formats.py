"""Each tool-call format reads back what it writes (`tool_formats/`): a Hermes block written for a
prompt is read as the same call, whole and streamed in pieces; a bare call object written is held by
the schema the module writes and read as the same call, whole and as it is written."""

from __future__ import annotations

import jsonschema
from specexec.tool_formats import hermes, json_calls

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": "é"}'}}
ADD_PARAMETERS = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}


def test_a_hermes_block_written_is_read_back_as_the_same_call():
    text = f"Adding.\n{hermes.block_text(CALL)}\ndone"
    (found,) = hermes.read_blocks(text)
    assert found.call == {"name": "add", "arguments": {"a": 1, "b": "é"}}
    assert text[found.start : found.end] == hermes.block_text(CALL)


def test_the_stream_reader_splits_text_and_blocks_as_the_whole_text_reads_them():
    text = f"Adding.\n{hermes.block_text(CALL)}\nthen <tool"
    reader, spans = hermes.StreamReader(), []
    for end in range(1, len(text) + 1):
        spans += reader.read(text[:end], final=False)
    spans += reader.read(text, final=True)
    blocks = [s for s in spans if isinstance(s, hermes.Block)]
    (found,) = hermes.read_blocks(text)
    assert [(b.start, b.end) for b in blocks] == [(found.start, found.end)]
    plain_ends = [s.end for s in spans if isinstance(s, hermes.Plain)]
    assert plain_ends == sorted(plain_ends) and plain_ends[-1] == len(text)
    assert max(e for e in plain_ends[:-1]) <= len(text) - len("<tool")  # the tail that may open a block


def test_a_json_call_written_is_held_by_the_schema_and_read_back():
    arguments = json_calls.arguments_object(CALL["function"]["arguments"])
    text = json_calls.call_text("add", arguments)
    one = json_calls.calls_schema({"add": ADD_PARAMETERS}, as_list=False)
    many = json_calls.calls_schema({"add": ADD_PARAMETERS, "now": {"type": "object"}}, as_list=True)
    jsonschema.validate(json_calls.read_values(text)[0], one)
    jsonschema.validate(json_calls.read_values(f"[{text}, {text}]"), many)
    assert json_calls.read_values(text) == [{"name": "add", "arguments": arguments}]
    assert json_calls.is_call(json_calls.read_values(text)[0])
    assert json_calls.read_values(text[:-3]) is None  # cut short: not JSON
    assert json_calls.calls_so_far(f"[{text}, {text[:-5]}", max_calls=16) == [
        ("add", text[len('{"name": "add", "arguments": ') : -1]),
        ("add", text[len('{"name": "add", "arguments": ') : -5]),
    ]
