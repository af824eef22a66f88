"""Request fields from other engines' clients and routers (`server/requests/`): mapped where
they mean what ours do, refused with a 400 naming them where honouring them is beyond this server,
logged once and ignored where no engine here knows them. sglang-router's re-written body is taken."""

from __future__ import annotations

import logging

import pytest
from specexec.server.protocol import BadRequest, parse_chat, parse_completion
from specexec.server.requests import fields

MESSAGES = [{"role": "user", "content": "hi"}]
#: what sglang-router 0.3.2 forwarded for a chat request sent as {messages, max_tokens: 8, temperature:
#: 0, top_k: 5, min_p: 0.1, repetition_penalty: 1.1, seed: 3, stop: ["x"]} (captured on loopback: it
#: renames max_tokens and adds SGLang's fields at their defaults)
SGLANG_ROUTER_BODY = {
    "messages": MESSAGES,
    "model": "m",
    "logprobs": False,
    "max_completion_tokens": 8,
    "seed": 3,
    "stop": ["x"],
    "stream": False,
    "temperature": 0.0,
    "top_k": 5,
    "min_p": 0.1,
    "repetition_penalty": 1.1,
    "no_stop_trim": False,
    "ignore_eos": False,
    "continue_final_message": False,
    "skip_special_tokens": True,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "return_hidden_states": False,
}
#: and for a /v1/completions request {prompt, max_tokens: 8}
SGLANG_ROUTER_COMPLETION = {
    "model": "m",
    "prompt": "hello",
    "max_tokens": 8,
    "stream": False,
    "echo": False,
    "no_stop_trim": False,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "return_hidden_states": False,
}


def test_sglang_routers_bodies_are_taken_with_their_values():
    parsed = parse_chat(SGLANG_ROUTER_BODY, 512)
    params = parsed.request.sampling_params
    assert (params.max_tokens, params.temperature, params.top_k, params.min_p) == (8, 0.0, 5, 0.1)
    assert (params.repetition_penalty, params.seed, params.stop) == (1.1, 3, ["x"])
    assert parsed.request.response_format is None and parsed.num_top_logprobs is None
    completion = parse_completion(SGLANG_ROUTER_COMPLETION, 512)
    assert completion.request.sampling_params.max_tokens == 8 and not completion.echo


@pytest.mark.parametrize(
    "field, value",
    [
        ("best_of", 2),
        ("use_beam_search", True),
        ("skip_special_tokens", False),
        ("include_stop_str_in_output", True),
        ("typical_p", 0.9),
        ("logits_processors", ["my.module:Processor"]),
        ("stop_regex", ["[0-9]+"]),
        ("guided_whitespace_pattern", "[ ]?"),
        ("lora_path", "adapter"),
        ("echo", True),
        ("skip_special_tokens", 1),  # (not a boolean)
    ],
)
def test_a_field_asking_for_what_this_server_cannot_do_is_a_400_naming_it(field, value):
    with pytest.raises(BadRequest) as err:
        parse_chat({"messages": MESSAGES, field: value}, 512)
    assert err.value.param == field


def test_vllm_and_sglang_schema_fields_become_the_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    by_vllm = parse_chat({"messages": MESSAGES, "guided_json": schema}, 512).request.response_format
    by_sglang = parse_chat(
        {"messages": MESSAGES, "json_schema": '{"type": "object"}'}, 512
    ).request.response_format
    assert by_vllm["type"] == "json_schema" and by_vllm["json_schema"]["schema"] == schema
    assert by_sglang["json_schema"]["schema"] == {"type": "object"}
    with pytest.raises(BadRequest) as err:
        parse_chat(
            {"messages": MESSAGES, "guided_json": schema, "response_format": {"type": "json_object"}}, 512
        )
    assert err.value.param == "guided_json"
    with pytest.raises(BadRequest):
        parse_chat({"messages": MESSAGES, "json_schema": "{not json"}, 512)


def test_an_unknown_field_is_ignored_and_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(fields, "_logged", set())
    with caplog.at_level(logging.WARNING, "specexec.server"):
        for _ in range(3):
            parsed = parse_chat({"messages": MESSAGES, "max_tokens": 4, "x_trace_hint": {"a": 1}}, 512)
            assert parsed.request.sampling_params.max_tokens == 4
        completion = parse_completion({"prompt": "hi", "max_completion_tokens": 3, "x_trace_hint": 1}, 512)
    assert completion.request.sampling_params.max_tokens == 3
    assert [r.message for r in caplog.records].count(
        "request field 'x_trace_hint' is not known to this server: ignored (logged once)"
    ) == 1


def test_top_logprobs_without_logprobs_is_refused_only_when_it_asks_for_some():
    assert parse_chat({"messages": MESSAGES, "top_logprobs": 0}, 512).num_top_logprobs is None
    with pytest.raises(BadRequest) as err:
        parse_chat({"messages": MESSAGES, "top_logprobs": 3}, 512)
    assert err.value.param == "top_logprobs"
