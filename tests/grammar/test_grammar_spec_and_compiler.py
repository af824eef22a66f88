"""response_format parsing and the asynchronous, cached grammar compiler pool."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import xgrammar as xgr
from grammar_support import EOS, SCHEMA, VOCAB, encode, smollm2_tokenizer, tokenizer_info
from specexec.grammar import GrammarCompilerPool, GrammarError, GrammarSpec

RF_SCHEMA = {"type": "json_schema", "json_schema": {"name": "t", "strict": True, "schema": SCHEMA}}


def test_parse_good_shapes():
    spec = GrammarSpec.from_response_format(RF_SCHEMA)
    assert spec == GrammarSpec("json_schema", json.dumps(SCHEMA, separators=(",", ":")))
    assert GrammarSpec.from_response_format({"type": "json_object"}) == GrammarSpec("json_object", "")
    assert GrammarSpec.from_response_format({"type": "regex", "regex": "[0-9]+"}) == GrammarSpec(
        "regex", "[0-9]+"
    )
    ebnf = 'root ::= "yes" | "no"'
    assert GrammarSpec.from_response_format({"type": "grammar", "grammar": ebnf}) == GrammarSpec("ebnf", ebnf)
    assert GrammarSpec.from_response_format({"type": "text"}) is None
    fmt = {"type": "const_string", "value": "ok"}
    st = GrammarSpec.from_response_format({"type": "structural_tag", "format": fmt})
    assert st.kind == "structural_tag" and json.loads(st.text) == {"type": "structural_tag", "format": fmt}


def test_schema_text_is_compact_and_keeps_property_order():
    # Property order is part of the grammar (xgrammar emits properties in declared order).
    ba = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    spec = GrammarSpec.from_response_format({"type": "json_schema", "json_schema": {"schema": ba}})
    assert spec.text == '{"type":"object","properties":{"b":{"type":"string"},"a":{"type":"integer"}}}'


def test_legacy_structural_tag_is_converted():
    rf = {
        "type": "structural_tag",
        "structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}],
        "triggers": ["<f>"],
    }
    fmt = json.loads(GrammarSpec.from_response_format(rf).text)["format"]
    assert fmt["type"] == "triggered_tags" and fmt["triggers"] == ["<f>"]
    assert fmt["tags"][0] == {
        "type": "tag",
        "begin": "<f>",
        "content": {"type": "json_schema", "json_schema": SCHEMA},
        "end": "</f>",
    }


@pytest.mark.parametrize(
    ("rf", "match"),
    [
        ([1], "must be an object"),
        ({}, "unsupported response_format type None"),
        ({"type": "xml"}, "unsupported response_format type 'xml'"),
        ({"type": "json_schema"}, '"json_schema" object'),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, '"schema" object'),
        ({"type": "json_schema", "json_schema": {"schema": "{}"}}, '"schema" object'),
        ({"type": "regex"}, 'non-empty string "regex"'),
        ({"type": "regex", "regex": ""}, 'non-empty string "regex"'),
        ({"type": "grammar", "grammar": 3}, 'non-empty string "grammar"'),
        ({"type": "structural_tag"}, '"format" object'),
        ({"type": "structural_tag", "structures": [{"begin": "<f>"}], "triggers": []}, "structures\\[0\\]"),
    ],
)
def test_parse_bad_shapes(rf, match):
    with pytest.raises(ValueError, match=match):
        GrammarSpec.from_response_format(rf)


def test_bad_kind_is_a_value_error():
    assert issubclass(GrammarError, ValueError)
    with pytest.raises(GrammarError, match="unknown grammar kind"):
        GrammarSpec("yaml", "")


@pytest.fixture(scope="module")
def pool():
    p = GrammarCompilerPool(smollm2_tokenizer(), VOCAB, [EOS], tokenizer_info=tokenizer_info())
    yield p
    p.shutdown()


def test_cache_hit_returns_same_object_and_compiles_once(pool):
    spec = GrammarSpec.from_response_format(RF_SCHEMA)
    n0, t0 = pool.num_compiles, len(pool.compile_times_ms)
    first = pool.submit(spec).result(timeout=60)
    again = GrammarSpec.from_response_format(json.loads(json.dumps(RF_SCHEMA)))  # equal, separate dict
    assert pool.submit(again).result(timeout=60) is first
    assert pool.num_compiles == n0 + 1 and len(pool.compile_times_ms) == t0 + 1
    stats = pool.compile_time_percentiles()
    times = list(pool.compile_times_ms)
    assert stats["count"] == len(times) >= 1
    assert stats["p50_ms"] == float(np.percentile(times, 50))  # numpy's, as the benchmark's rows


def test_concurrent_requests_share_the_pending_future(pool, monkeypatch):
    release = threading.Event()
    real = pool._dispatch
    monkeypatch.setattr(pool, "_dispatch", lambda spec: (release.wait(10), real(spec))[1])
    spec = GrammarSpec("regex", "[a-c]{2}")
    t0 = time.perf_counter()
    f1, f2 = pool.submit(spec), pool.submit(spec)
    assert time.perf_counter() - t0 < 0.5  # submit never waits for the compile
    assert f1 is f2 and not f1.done()
    release.set()
    m = xgr.GrammarMatcher(f1.result(timeout=60))
    assert m.accept_string("ab") and not m.accept_string("d")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (GrammarSpec("json_schema", '{"type": 5}'), "invalid JSON schema: "),
        (GrammarSpec("json_schema", "{not json"), "invalid JSON schema: "),
        (GrammarSpec("regex", "(["), "invalid regex: "),
        (GrammarSpec("ebnf", "root ::= ("), "invalid EBNF grammar: "),
        (GrammarSpec("structural_tag", '{"type": "structural_tag"}'), "invalid structural tag: "),
    ],
)
def test_compile_errors_surface_through_the_future(pool, spec, message):
    good = GrammarSpec("regex", "[0-9]+x")
    bad_future, good_future = pool.submit(spec), pool.submit(good)
    exc = bad_future.exception(timeout=60)
    assert isinstance(exc, GrammarError) and str(exc).startswith(message)
    assert "/project/cpp" not in str(exc)  # xgrammar's log prefix is stripped
    assert not pool.cached(spec)  # failures are not cached
    assert good_future.result(timeout=60) is not None


def test_other_kinds_compile(pool):
    st = {
        "type": "structural_tag",
        "structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}],
        "triggers": ["<f>"],
    }
    for rf, text in [
        ({"type": "json_object"}, '{"x": [1, null]}'),
        ({"type": "grammar", "grammar": 'root ::= "yes" | "no"'}, "no"),
        (st, 'call <f>{"a": 1, "b": ""}</f> done'),
    ]:
        m = xgr.GrammarMatcher(pool.get(GrammarSpec.from_response_format(rf), timeout=60))
        for t in encode(text):
            assert m.accept_token(t), (rf["type"], t)


@pytest.mark.parametrize("text", ["[1]", '"x"', "7", "null"])
def test_json_object_is_held_to_an_object(pool, text):
    """OpenAI's JSON mode promises an object: no other JSON value may start the output (xgrammar's
    builtin JSON grammar once let a top-level array through)."""
    m = xgr.GrammarMatcher(pool.get(GrammarSpec.from_response_format({"type": "json_object"}), timeout=60))
    assert not all(m.accept_token(t) for t in encode(text))


def test_submit_after_shutdown_raises():
    p = GrammarCompilerPool(None, VOCAB, [EOS], max_workers=1, tokenizer_info=tokenizer_info())
    p.shutdown()
    with pytest.raises(RuntimeError):
        p.submit(GrammarSpec("regex", "a"))
    assert not p.cached(GrammarSpec("regex", "a"))
