"""The field table (`server/requests/field_table.py`), row by row: a default-only field at another value is
a 400 naming it and at its default a 200 (through the real server); a mapped field changes what the
engine receives (the parsed request, and for the Responses API the chat request and the response object
it makes); an ignored field leaves the answer as it was (through the real server, greedy)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from served import served
from specexec.server.protocol import BadRequest, parse_chat, parse_completion
from specexec.server.requests.field_table import CHAT, COMPLETIONS, FIELDS, RESPONSES, Action, markdown_table
from specexec.server.responses_api import ResponseStore, StoredResponse, response_object, to_chat_body

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
RESPONSES_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
STRUCTURES = {"structures": [{"begin": "<a>", "schema": SCHEMA, "end": "</a>"}], "triggers": ["<a>"]}
BASE = {
    CHAT: {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4, "temperature": 0},
    COMPLETIONS: {"prompt": "The colour of the sky is", "max_tokens": 4, "temperature": 0},
    RESPONSES: {"input": "Name a colour.", "max_output_tokens": 4, "temperature": 0},
}
PATHS = {CHAT: "/v1/chat/completions", COMPLETIONS: "/v1/completions", RESPONSES: "/v1/responses"}
#: a key inside an object field goes into this object (what its row needs around it)
INSIDE = {
    "structured_outputs": {"regex": "[a-c]{1,3}"},
    "response_format": {"type": "structural_tag", **STRUCTURES},
    "response_format.json_schema": {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
    "text": {},
}
#: mapped rows: (the field's part of the body, what the body without it holds instead); by name, or
#: by (name, endpoint) where the endpoints differ
PROBES = {
    "messages": ({"messages": [{"role": "user", "content": "Name a fruit."}]}, {}),
    "prompt": ({"prompt": "The colour of grass is"}, {}),
    "input": ({"input": "Name a fruit."}, {}),
    "instructions": ({"instructions": "Answer in French."}, {}),
    "previous_response_id": ({"previous_response_id": "resp_stored"}, {}),
    "max_tokens": ({"max_tokens": 7}, {}),
    "max_completion_tokens": ({"max_completion_tokens": 7}, {}),
    "max_output_tokens": ({"max_output_tokens": 7}, {}),
    "n_predict": ({"n_predict": 7, "max_tokens": None}, {"max_tokens": None}),
    "temperature": ({"temperature": 0.7}, {}),
    "top_p": ({"top_p": 0.5}, {}),
    "seed": ({"seed": 7}, {}),
    "stop": ({"stop": ["blue"]}, {}),
    "frequency_penalty": ({"frequency_penalty": 0.5}, {}),
    "presence_penalty": ({"presence_penalty": 0.5}, {}),
    "logit_bias": ({"logit_bias": {"5": 2}}, {}),
    "n": ({"n": 2}, {}),
    ("logprobs", CHAT): ({"logprobs": True}, {}),
    ("logprobs", COMPLETIONS): ({"logprobs": 2}, {}),
    "top_logprobs": ({"logprobs": True, "top_logprobs": 2}, {"logprobs": True}),
    "echo": ({"echo": True}, {}),
    "stream": ({"stream": True}, {}),
    "stream_options": ({"stream": True, "stream_options": {"include_usage": True}}, {"stream": True}),
    "response_format": ({"response_format": {"type": "json_object"}}, {}),
    "text": ({"text": {"format": {"type": "json_object"}}}, {}),
    "text.format": ({"text": {"format": {"type": "json_schema", "name": "t", "schema": SCHEMA}}}, {}),
    ("tools", CHAT): ({"tools": [TOOL]}, {}),
    ("tools", RESPONSES): ({"tools": [RESPONSES_TOOL]}, {}),
    ("tool_choice", CHAT): ({"tools": [TOOL], "tool_choice": "required"}, {"tools": [TOOL]}),
    ("tool_choice", RESPONSES): (
        {"tools": [RESPONSES_TOOL], "tool_choice": "required"},
        {"tools": [RESPONSES_TOOL]},
    ),
    ("parallel_tool_calls", CHAT): (
        {"tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False},
        {"tools": [TOOL], "tool_choice": "required"},
    ),
    ("parallel_tool_calls", RESPONSES): (
        {"tools": [RESPONSES_TOOL], "tool_choice": "required", "parallel_tool_calls": False},
        {"tools": [RESPONSES_TOOL], "tool_choice": "required"},
    ),
    "store": ({"store": False}, {}),
    "metadata": ({"metadata": {"k": "v"}}, {}),
    "top_k": ({"top_k": 5}, {}),
    "min_p": ({"min_p": 0.1}, {}),
    "repetition_penalty": ({"repetition_penalty": 1.2}, {}),
    "ignore_eos": ({"ignore_eos": True}, {}),
    "min_tokens": ({"min_tokens": 2}, {}),
    "stop_token_ids": ({"stop_token_ids": [5]}, {}),
    "prompt_logprobs": ({"prompt_logprobs": 1}, {}),
    ("add_special_tokens", CHAT): ({"add_special_tokens": True}, {}),
    ("add_special_tokens", COMPLETIONS): ({"add_special_tokens": False}, {}),
    "chat_template_kwargs": ({"chat_template_kwargs": {"enable_thinking": False}}, {}),
    "cache_salt": ({"cache_salt": "tenant-a"}, {}),
    "structured_outputs": ({"structured_outputs": {"choice": ["red", "blue"]}}, {}),
    "structured_outputs.json": ({"structured_outputs": {"json": SCHEMA}}, {}),
    "structured_outputs.regex": ({"structured_outputs": {"regex": "[a-c]+"}}, {}),
    "structured_outputs.choice": ({"structured_outputs": {"choice": ["red", "blue"]}}, {}),
    "structured_outputs.grammar": ({"structured_outputs": {"grammar": 'root ::= "red"'}}, {}),
    "structured_outputs.json_object": ({"structured_outputs": {"json_object": True}}, {}),
    "structured_outputs.structural_tag": (
        {"structured_outputs": {"structural_tag": json.dumps(STRUCTURES)}},
        {},
    ),
    "guided_json": ({"guided_json": SCHEMA}, {}),
    "guided_regex": ({"guided_regex": "[a-c]+"}, {}),
    "guided_choice": ({"guided_choice": ["red", "blue"]}, {}),
    "guided_grammar": ({"guided_grammar": 'root ::= "red"'}, {}),
    "regex": ({"regex": "[a-c]+"}, {}),
    "ebnf": ({"ebnf": 'root ::= "red"'}, {}),
    "json_schema": ({"json_schema": json.dumps(SCHEMA)}, {}),
    "grammar": ({"grammar": 'root ::= "red" | "blue"'}, {}),
    "response_format.type": (
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "text"}},
    ),
    "response_format.json_schema": (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
        {"response_format": {"type": "json_object"}},
    ),
    "response_format.schema": (  # (json_object with a schema follows the schema)
        {"response_format": {"type": "json_object", "schema": SCHEMA}},
        {"response_format": {"type": "json_object"}},
    ),
    "response_format.regex": ({"response_format": {"type": "regex", "regex": "[a-c]+"}}, {}),
    "response_format.grammar": ({"response_format": {"type": "grammar", "grammar": 'root ::= "red"'}}, {}),
    "response_format.choice": ({"response_format": {"type": "choice", "choice": ["red", "blue"]}}, {}),
    "response_format.format": (
        {"response_format": {"type": "structural_tag", "format": {"type": "const_string", "value": "red"}}},
        {},
    ),
    "response_format.structures": ({"response_format": {"type": "structural_tag", **STRUCTURES}}, {}),
    "response_format.triggers": (
        {"response_format": {"type": "structural_tag", **STRUCTURES}},
        {"response_format": {"type": "structural_tag", **STRUCTURES, "triggers": ["<b>"]}},
    ),
    "response_format.json_schema.schema": (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}},
    ),
}
#: ignored rows: a value to send (checked ones need a valid one)
IGNORED_VALUES = {"user": "u-1", "metadata": {"k": "v"}, "stream_options": {"include_obfuscation": True}}


def rows(action: Action) -> list[tuple[str, str]]:
    return [(f.name, e) for f in FIELDS if f.action is action for e in f.endpoints]


def row(name: str, endpoint: str):
    (found,) = [f for f in FIELDS if f.name == name and endpoint in f.endpoints]
    return found


def with_field(endpoint: str, name: str, value) -> dict:
    """The endpoint's base body with ``name`` (``parent.key`` inside its parent) set to ``value``."""
    parent, _, key = name.rpartition(".")
    if not parent:
        return {**BASE[endpoint], name: value}
    inner = json.loads(json.dumps(INSIDE[parent]))
    if parent == "response_format.json_schema":
        inner["json_schema"][key] = value
        return {**BASE[endpoint], "response_format": inner}
    return {**BASE[endpoint], parent: {**inner, key: value}}


def engine_view(endpoint: str, body: dict) -> str:
    """Everything the engine and the response builder get from ``body``."""
    body = {k: v for k, v in body.items() if v is not None}
    if endpoint == CHAT:
        return repr(parse_chat(body, 256, False))
    if endpoint == COMPLETIONS:
        return repr(parse_completion(body, 256))
    store = ResponseStore()
    store.put("resp_stored", StoredResponse([{"role": "user", "content": "Hi."}], {"id": "resp_stored"}))
    asked = to_chat_body(body, store)
    answer = response_object("resp_1", asked, "tiny", 0, "completed", [], None)
    return repr((parse_chat(asked.chat_body, 256, False), asked.store, asked.history, answer))


def test_each_field_has_one_row_per_endpoint():
    seen = [(f.name, e) for f in FIELDS for e in f.endpoints]
    assert len(seen) == len(set(seen)), sorted(s for s in seen if seen.count(s) > 1)


def params(found: list[tuple[str, str]]) -> list:
    return [pytest.param(name, endpoint, id=f"{name}-{endpoint}") for name, endpoint in found]


#: (the model row: a 404 when another model is named, `test_another_model_is_a_404`)
@pytest.mark.parametrize("name, endpoint", params([r for r in rows(Action.MAPPED) if r[0] != "model"]))
def test_a_mapped_field_changes_what_the_engine_receives(name, endpoint):
    with_it, without_it = PROBES.get((name, endpoint)) or PROBES[name]
    assert engine_view(endpoint, {**BASE[endpoint], **with_it}) != engine_view(
        endpoint, {**BASE[endpoint], **without_it}
    )


@pytest.fixture(scope="module")
def server():
    with served() as (base, engine, stack):
        yield base, stack.enter_context(httpx.Client(base_url=base, timeout=60))


def answer_text(endpoint: str, reply: httpx.Response) -> str:
    body = reply.json()
    if endpoint == RESPONSES:
        return json.dumps(body["output"][0]["content"][0]["text"])
    choice = body["choices"][0]
    return choice["message"]["content"] if endpoint == CHAT else choice["text"]


def non_default(accepted: tuple):
    """A value none of ``accepted`` is."""
    if accepted and isinstance(accepted[0], bool):
        return not accepted[0]
    if accepted and isinstance(accepted[0], (int, float)):
        return max(accepted) + 3
    return "not-a-default"


@pytest.mark.parametrize("name, endpoint", params(rows(Action.DEFAULT_ONLY)))
def test_a_default_only_field_is_a_400_naming_it_unless_at_its_default(server, name, endpoint):
    _, http = server
    accepted = row(name, endpoint).accepted
    refused = http.post(PATHS[endpoint], json=with_field(endpoint, name, non_default(accepted)))
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == name.split(".")[0] and name in error["message"]
    for default in (*accepted[:1], None):
        taken = http.post(PATHS[endpoint], json=with_field(endpoint, name, default))
        assert taken.status_code == 200, (default, taken.text)


@pytest.mark.parametrize("name, endpoint", params(rows(Action.IGNORED)))
def test_an_ignored_field_leaves_the_answer_as_it_was(server, name, endpoint):
    _, http = server
    parent = name.rpartition(".")[0]
    base = with_field(endpoint, parent, INSIDE[parent]) if parent in INSIDE and "." not in parent else None
    if parent == "response_format.json_schema":
        base = {**BASE[endpoint], "response_format": INSIDE[parent]}
    before = http.post(PATHS[endpoint], json=base or BASE[endpoint])
    after = http.post(
        PATHS[endpoint], json=with_field(endpoint, name, IGNORED_VALUES.get(name, "some value"))
    )
    assert before.status_code == after.status_code == 200, after.text
    assert answer_text(endpoint, after) == answer_text(endpoint, before)


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS, RESPONSES])
def test_another_model_is_a_404(server, endpoint):
    _, http = server
    assert http.post(PATHS[endpoint], json={**BASE[endpoint], "model": "tiny"}).status_code == 200
    assert http.post(PATHS[endpoint], json={**BASE[endpoint], "model": "other"}).status_code == 404


@pytest.mark.parametrize(
    "endpoint, fields, allowed",
    [
        (CHAT, {"structured_outputs": {"choice": ["red", "blue"]}}, {"red", "blue"}),
        (COMPLETIONS, {"guided_choice": ["red", "blue"]}, {"red", "blue"}),
        (
            RESPONSES,
            {"structured_outputs": {"choice": ["red", "blue"]}},
            {json.dumps("red"), json.dumps("blue")},
        ),
        (CHAT, {"grammar": 'root ::= "red" | "blue"'}, {"red", "blue"}),
        (COMPLETIONS, {"regex": "(red|blue)"}, {"red", "blue"}),
    ],
)
def test_guided_fields_constrain_the_answer_through_the_server(server, endpoint, fields, allowed):
    _, http = server
    reply = http.post(
        PATHS[endpoint],
        json={**BASE[endpoint], **fields, "max_tokens": 8}
        if endpoint != RESPONSES
        else {**BASE[endpoint], **fields},
    )
    assert reply.status_code == 200, reply.text
    assert answer_text(endpoint, reply) in allowed


def test_a_json_object_with_a_schema_follows_the_schema(server):
    _, http = server
    body = {**BASE[CHAT], "max_tokens": 40, "response_format": {"type": "json_object", "schema": SCHEMA}}
    parsed = parse_chat(body, 256)
    assert parsed.request.response_format["json_schema"]["schema"] == SCHEMA
    reply = http.post(PATHS[CHAT], json=body)
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"response_format": {"type": "json_object", "regex": "a"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA, "extra": 1}}},
            "response_format",
        ),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"pattern": "a"}}, "structured_outputs"),
        ({"guided_regex": "a", "regex": "b"}, "regex"),
        ({"guided_choice": "yes"}, "guided_choice"),
        ({"chat_template_kwargs": {"tokenize": False}}, "chat_template_kwargs"),
        ({"add_special_tokens": 1}, "add_special_tokens"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ],
)
def test_what_a_mapped_field_cannot_mean_is_a_400_naming_it(fields, param):
    with pytest.raises(BadRequest) as err:
        parse_chat({**BASE[CHAT], **fields}, 256)
    assert err.value.param == param


def test_the_responses_text_keys_it_does_not_read_are_refused():
    for text in ({"format": {"type": "json_object", "schema": SCHEMA}}, {"formats": {}}):
        with pytest.raises(BadRequest) as err:
            to_chat_body({**BASE[RESPONSES], "text": text}, ResponseStore())
        assert err.value.param == "text"


def test_every_mapped_row_has_a_probe():
    missing = {n for n, e in rows(Action.MAPPED) if n != "model" and (n, e) not in PROBES and n not in PROBES}
    assert not missing


def test_the_docs_print_the_table():
    docs = (Path(__file__).parents[2] / "docs" / "serving.md").read_text()
    printed = docs.split("<!-- fields:start -->\n", 1)[1].split("\n<!-- fields:end -->", 1)[0]
    assert printed == markdown_table(), "docs/serving.md: print markdown_table() between the markers"
