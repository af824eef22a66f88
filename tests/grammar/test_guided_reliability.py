"""Guided requests that once broke the executor for everyone, and schema semantics xgrammar alone does not
enforce: each bad grammar fails (or ends) its own request, the good request beside it completes, the
next call works, and every finished guided output is checked and says so."""

from __future__ import annotations

import copy
import json
import time

import jsonschema
import pytest
from factories import assert_all_pages_free, schema_format
from grammar_support import smollm2_tokenizer, tag_grammar
from specexec import Executor, ExecutorConfig, FinishReason, Request, SamplingParams
from specexec.grammar import RequestGrammar
from tiny_models import make_tiny_model

VOCAB = 49152
GOOD_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "maximum": 9}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
CHAT = [{"role": "user", "content": "JSON please."}]
_MODEL = make_tiny_model("llama", vocab_size=VOCAB)[1]


def guided_model_copy_executor(tokenizer=None, **overrides) -> Executor:
    """An executor over a copy of the one tiny model of the SmolLM2 vocabulary (built once), compact JSON."""
    settings = dict(
        num_kv_blocks=128, block_size=8, dtype="float64", device="cpu", guided_json_max_whitespace=0
    )
    settings.update(overrides)
    return Executor(
        copy.deepcopy(_MODEL), ExecutorConfig(**settings), tokenizer=tokenizer or smollm2_tokenizer()
    )


def good_request(max_tokens: int = 40) -> Request:
    return Request(CHAT, SamplingParams(max_tokens=max_tokens), response_format=schema_format(GOOD_SCHEMA))


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "regex", "regex": "[^\\x00-\\U0010FFFF]"},
        schema_format({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
    ],
    ids=["regex-no-character", "schema-only-self-reference"],
)
def test_a_grammar_that_admits_no_token_fails_alone(response_format):
    executor = guided_model_copy_executor()
    clean = executor.run([good_request()])[0]
    bad = Request(CHAT, SamplingParams(max_tokens=20), response_format=response_format)
    out_good, out_bad = executor.run([good_request(), bad])
    assert out_bad.finish_reason is FinishReason.ERROR
    # (xgrammar 0.2.9 refuses the self-reference when it compiles the schema; earlier ones compiled it)
    reasons = ("admits no token", "cannot enforce", "invalid JSON schema")
    assert any(reason in out_bad.error for reason in reasons), out_bad.error
    assert (out_good.finish_reason, out_good.token_ids) == (clean.finish_reason, clean.token_ids)
    assert (
        out_good.guided_valid is (out_good.finish_reason is FinishReason.STOP)
        or out_good.guided_valid is False
    )
    assert_all_pages_free(executor)
    assert executor.run([good_request()])[0].token_ids == clean.token_ids  # the next call works


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "grammar", "grammar": 'root ::= a\na ::= "x" a'},
        schema_format({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]}),
    ],
    ids=["ebnf-infinite", "schema-required-recursion"],
)
def test_a_grammar_whose_only_derivation_is_infinite_is_bounded(response_format):
    """xgrammar's jump-forward search never returns on these; the bounded forced-token walk does, and
    the request ends at its token budget."""
    executor = guided_model_copy_executor()
    request = Request(CHAT, SamplingParams(max_tokens=30), response_format=response_format)
    start = time.perf_counter()
    out_good, out = executor.run([good_request(), request])
    assert time.perf_counter() - start < 60
    assert out.finish_reason in (FinishReason.LENGTH, FinishReason.ERROR), out.error
    if out.finish_reason is FinishReason.LENGTH:
        assert len(out.token_ids) == 30 and out.guided_valid is not True
    assert out_good.finish_reason is not FinishReason.ERROR
    assert_all_pages_free(executor)


def test_forced_tokens_are_walked_one_allowed_token_at_a_time():
    executor = guided_model_copy_executor()
    schema = {
        "type": "object",
        "properties": {"constant_key_here": {"const": "a fixed value"}},
        "required": ["constant_key_here"],
    }
    out = executor.run([Request(CHAT, SamplingParams(max_tokens=60), response_format=schema_format(schema))])[
        0
    ]
    assert out.finish_reason is FinishReason.STOP and json.loads(out.text) == {
        "constant_key_here": "a fixed value"
    }
    assert out.metrics.num_forced_tokens > 0  # the key and the value were proposed as drafts
    assert out.guided_valid is True


def test_a_tokenizer_without_eos_keeps_guided_decoding_working():
    """With no stop token at all, a guided request ends when its output is complete, and a malformed
    schema reports its own error (not xgrammar's "stop_token_ids cannot be empty")."""
    tokenizer = smollm2_tokenizer()
    tokenizer.eos_token = None
    executor = guided_model_copy_executor(tokenizer)
    assert not executor.core.outputs.eos_token_ids
    malformed = Request(CHAT, SamplingParams(max_tokens=8), response_format=schema_format({"type": 5}))
    regex = Request(
        CHAT, SamplingParams(max_tokens=20), response_format={"type": "regex", "regex": "(yes|no)!"}
    )
    out_good, out_bad, out_regex = executor.run([good_request(60), malformed, regex])
    assert out_bad.finish_reason is FinishReason.ERROR and "invalid JSON schema" in out_bad.error, (
        out_bad.error
    )
    assert out_regex.finish_reason is FinishReason.STOP and out_regex.text in ("yes!", "no!")
    assert out_good.finish_reason is FinishReason.STOP, out_good.text
    jsonschema.validate(json.loads(out_good.text), GOOD_SCHEMA)
    assert out_good.guided_valid is True and out_regex.guided_valid is True
    assert_all_pages_free(executor)


#: xgrammar alone lets outputs through that break this: it falls back to anyOf semantics
ANYOF_WITH_SIBLING = {
    "type": "object",
    "properties": {
        "a": {"type": "integer"},
        "b": {"type": "integer"},
        "c": {"type": "string", "maxLength": 3},
    },
    "required": ["b"],
    "anyOf": [{"required": ["a"]}, {"required": ["c"]}],
}


def test_anyof_with_sibling_keywords_is_enforced_after_normalization():
    """40 sampled outputs: every one that finished is valid for jsonschema, and says so."""
    executor = guided_model_copy_executor()
    requests = [
        Request(
            CHAT,
            SamplingParams(max_tokens=48, temperature=1.0, seed=i),
            response_format=schema_format(ANYOF_WITH_SIBLING),
        )
        for i in range(40)
    ]
    outputs = executor.run(requests)
    finished = [o for o in outputs if o.finish_reason is FinishReason.STOP]
    assert len(finished) >= 20, [o.finish_reason for o in outputs]
    for out in finished:
        jsonschema.validate(json.loads(out.text), ANYOF_WITH_SIBLING)
        assert out.guided_valid is True
    for out in outputs:
        if out.finish_reason is FinishReason.LENGTH:
            assert out.guided_valid is False and out.guided_error  # cut short: not valid, and says why


UNENFORCEABLE = {
    "type": "object",
    "properties": {"a": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
    "required": ["a"],
}


def test_an_unenforceable_keyword_is_refused_naming_it():
    executor = guided_model_copy_executor()
    out_good, out = executor.run(
        [
            good_request(),
            Request(CHAT, SamplingParams(max_tokens=30), response_format=schema_format(UNENFORCEABLE)),
        ]
    )
    assert out.finish_reason is FinishReason.ERROR and "not" in out.error and "/properties/a" in out.error, (
        out.error
    )
    assert out_good.finish_reason is not FinishReason.ERROR


def test_an_unenforceable_keyword_with_warn_generates_and_says_so():
    executor = guided_model_copy_executor(guided_unsupported="warn")
    requests = [
        Request(
            CHAT,
            SamplingParams(max_tokens=30, temperature=1.0, seed=i),
            response_format=schema_format(UNENFORCEABLE),
        )
        for i in range(6)
    ]
    for out in executor.run(requests):
        assert out.finish_reason is not FinishReason.ERROR, out.error
        assert any("not enforced" in w and "uniqueItems" in w for w in out.warnings), out.warnings
        if out.finish_reason is FinishReason.STOP:
            try:
                jsonschema.validate(json.loads(out.text), UNENFORCEABLE)
                valid = True
            except (ValueError, jsonschema.ValidationError):
                valid = False
            assert out.guided_valid is valid  # the verdict is jsonschema's


def test_a_grammar_matcher_that_breaks_mid_request_fails_only_its_request(monkeypatch):
    executor = guided_model_copy_executor()
    after = RequestGrammar.after_verification
    calls = {"n": 0}

    def breaking(self, num_accepted, emitted):
        calls["n"] += 1
        if getattr(self, "breaks", False) and calls["n"] > 3:
            raise RuntimeError("matcher state lost")
        return after(self, num_accepted, emitted)

    tag_grammar(executor, "bad", "breaks")
    monkeypatch.setattr(RequestGrammar, "after_verification", breaking)
    bad = Request(CHAT, SamplingParams(max_tokens=40), "bad", schema_format(GOOD_SCHEMA))
    other = Request(
        [{"role": "user", "content": "Other."}],
        SamplingParams(max_tokens=40),
        None,
        schema_format(GOOD_SCHEMA),
    )
    out_bad, out_other = executor.run([bad, other])
    assert out_bad.finish_reason is FinishReason.ERROR and "matcher state lost" in out_bad.error
    assert out_other.finish_reason is not FinishReason.ERROR
    assert_all_pages_free(executor)
