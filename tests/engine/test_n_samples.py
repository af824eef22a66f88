"""``SamplingParams.n``: n samples of one prompt, each its own request ``<id>#<i>`` seeded with seed + i;
one output per request (sample 0's, with every sample listed), abort by the request's id, pages freed."""

from __future__ import annotations

import pytest
from factories import assert_all_pages_free, drafting_config
from specexec.executor.engine.request import FinishReason, Request
from specexec.executor.executor import Executor
from specexec.sampling import SamplingParams
from tiny_models import make_tiny_model

PROMPT = [5, 6, 7, 5, 6, 7, 5]
NGRAM = {"decoding_type": "NGram", "max_draft_len": 3}


def ngram_executor() -> Executor:
    """The tiny llama drafting with NGram every step."""
    _, model = make_tiny_model("llama")
    return Executor(model, drafting_config(speculative_config=NGRAM))


def test_n_seeded_samples_each_equal_a_single_request_with_seed_plus_i():
    executor = ngram_executor()
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=11, n=3, ignore_eos=True)
    out = executor.run([Request(PROMPT, params, request_id="x")])[0]
    assert out.request_id == "x" and [s.request_id for s in out.samples] == ["x#0", "x#1", "x#2"]
    assert [s.sample_index for s in out.samples] == [0, 1, 2] and out.token_ids == out.samples[0].token_ids
    singles = executor.run(
        [
            Request(PROMPT, SamplingParams(max_tokens=8, temperature=1.0, seed=11 + i, ignore_eos=True))
            for i in range(3)
        ]
    )
    assert [s.token_ids for s in out.samples] == [o.token_ids for o in singles]
    assert len({tuple(s.token_ids) for s in out.samples}) > 1, "samples with different seeds differ"
    assert_all_pages_free(executor)


def test_greedy_samples_are_identical_and_a_plain_request_has_no_samples():
    executor = ngram_executor()
    out, plain = executor.run(
        [Request(PROMPT, SamplingParams(max_tokens=6, n=2)), Request(PROMPT, SamplingParams(max_tokens=6))]
    )
    assert out.samples[0].token_ids == out.samples[1].token_ids == plain.token_ids
    assert plain.samples == [] and plain.sample_index == 0


def test_aborting_the_request_aborts_every_sample_and_frees_their_pages():
    executor = ngram_executor()
    executor.add_request(
        Request(PROMPT, SamplingParams(max_tokens=500, n=3, ignore_eos=True), request_id="y")
    )
    executor.step()
    assert executor.abort_request("y")
    events = executor.step()
    aborted = {e.request_id for e in events if e.finished and e.output.finish_reason is FinishReason.ABORT}
    assert aborted == {"y#0", "y#1", "y#2"}
    assert not executor.abort_request("y")
    assert_all_pages_free(executor)


@pytest.mark.parametrize("bad", [0, -1, "x", 65, 2.0])
def test_a_bad_n_fails_that_request_alone_naming_n(bad):
    executor = ngram_executor()
    bad_out, good = executor.run(
        [Request(PROMPT, SamplingParams(max_tokens=4, n=bad)), Request(PROMPT, SamplingParams(max_tokens=4))]
    )
    assert bad_out.finish_reason is FinishReason.ERROR and "n must be" in bad_out.error
    assert good.finish_reason is FinishReason.LENGTH


def test_streaming_n_samples_interleaves_their_events_and_finishes_each():
    executor = ngram_executor()
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=2, n=3, ignore_eos=True)
    events = list(executor.stream([Request(PROMPT, params, request_id="z")]))
    finished = {e.sample_index: e.output for e in events if e.finished}
    assert sorted(finished) == [0, 1, 2]
    for i, output in finished.items():
        assert [t for e in events if e.sample_index == i for t in e.token_ids] == output.token_ids
    assert_all_pages_free(executor)
