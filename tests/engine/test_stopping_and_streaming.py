"""Stop conditions (stop tokens, EOS, stop strings, max_tokens, context), streaming, seeded sampling,
and per-request metrics."""

from __future__ import annotations

import pytest
from factories import greedy, tiny_config
from specexec.executor.engine.request import FinishReason, Request
from specexec.executor.executor import Executor
from specexec.sampling import SamplingParams
from tiny_models import make_prompts, make_tiny_model, make_tiny_tokenizer

MAX_TOKENS = 10
#: prompt "w100": the tiny llama's greedy continuation has 10 distinct tokens (checked below)
PROMPT = "w100"


def executor_with_eos(eos_token_id: int | None = None, **config_overrides) -> Executor:
    """The tiny llama with its tokenizer, ``eos_token_id`` its generation config's EOS (none by default)."""
    _, model = make_tiny_model("llama")
    model.generation_config.eos_token_id = eos_token_id
    config = tiny_config(**{"num_kv_blocks": 64, "max_num_tokens": 64, **config_overrides})
    return Executor(model, config, tokenizer=make_tiny_tokenizer())


def unstopped(prompt=PROMPT, max_tokens: int = MAX_TOKENS):
    (out,) = executor_with_eos().run([prompt], greedy(max_tokens))
    assert out.finish_reason is FinishReason.LENGTH
    return out


def test_reference_continuation_has_distinct_tokens():
    """Guard for the tests below, which stop on the k-th token of this continuation."""
    out = unstopped()
    assert len(out.token_ids) == MAX_TOKENS
    assert len(set(out.token_ids)) == MAX_TOKENS
    assert out.text == make_tiny_tokenizer().decode(out.token_ids)


# ---- stop tokens and EOS ---------------------------------------------------------------------------------


def test_stop_token_id_stops_with_the_stop_token_last():
    full = unstopped().token_ids
    (out,) = executor_with_eos().run([PROMPT], greedy(MAX_TOKENS, stop_token_ids=[full[3]]))
    assert out.finish_reason is FinishReason.STOP
    assert out.token_ids == full[:4]
    assert out.token_ids[-1] == full[3]
    assert out.metrics.num_output_tokens == 4


def test_first_of_several_stop_token_ids_to_appear_stops():
    full = unstopped().token_ids
    (out,) = executor_with_eos().run(
        [PROMPT], greedy(MAX_TOKENS, stop_token_ids=[full[6], full[2], 255 - full[0]])
    )
    assert out.token_ids == full[:3]


def test_model_eos_stops_unless_ignore_eos():
    full = unstopped().token_ids
    executor = executor_with_eos(eos_token_id=full[4])
    stopped, ignored = executor.run(
        [
            Request(PROMPT, greedy(MAX_TOKENS, ignore_eos=False)),
            Request(PROMPT, greedy(MAX_TOKENS, ignore_eos=True)),
        ]
    )
    assert stopped.finish_reason is FinishReason.STOP
    assert stopped.token_ids == full[:5]
    assert ignored.finish_reason is FinishReason.LENGTH
    assert ignored.token_ids == full


def test_adding_a_stop_string_that_never_matches_changes_nothing():
    full = unstopped()
    stop_token = full.token_ids[3]
    executor = executor_with_eos()
    plain, with_stop_string = executor.run(
        [
            Request(PROMPT, greedy(MAX_TOKENS, stop_token_ids=[stop_token])),
            Request(PROMPT, greedy(MAX_TOKENS, stop_token_ids=[stop_token], stop=["no such text"])),
        ]
    )
    assert with_stop_string.token_ids == plain.token_ids == full.token_ids[:4]
    assert with_stop_string.finish_reason is plain.finish_reason is FinishReason.STOP
    assert with_stop_string.text == plain.text, "the stop token's text is lost when stop strings are set"


def test_adding_a_stop_string_that_never_matches_changes_nothing_at_max_tokens():
    full = unstopped()
    (out,) = executor_with_eos().run([PROMPT], greedy(MAX_TOKENS, stop=["no such text"]))
    assert out.token_ids == full.token_ids
    assert out.text == full.text
    assert out.finish_reason is FinishReason.LENGTH


# ---- stop strings ----------------------------------------------------------------------------------------


def expected_stop(full_tokens: list[int], stop: str) -> tuple[list[int], str]:
    """Tokens up to the one that completes `stop`, and the text cut where `stop` starts."""
    tokenizer = make_tiny_tokenizer()
    for n in range(1, len(full_tokens) + 1):
        text = tokenizer.decode(full_tokens[:n])
        if stop in text:
            return full_tokens[:n], text[: text.index(stop)]
    raise AssertionError(f"{stop!r} not in the continuation")


@pytest.mark.parametrize("k", [0, 2, 5])
def test_stop_string_of_one_word_cuts_the_text_before_it(k):
    full = unstopped()
    word = make_tiny_tokenizer().decode([full.token_ids[k]])
    assert full.text.count(word) == 1
    (out,) = executor_with_eos().run([PROMPT], greedy(MAX_TOKENS, stop=[word]))
    tokens, text = expected_stop(full.token_ids, word)
    assert out.finish_reason is FinishReason.STOP
    assert out.token_ids == tokens == full.token_ids[: k + 1]
    assert out.text == text
    assert word not in out.text
    assert full.text.startswith(out.text)


def test_stop_string_spanning_two_tokens_cuts_where_it_starts():
    full = unstopped()
    words = full.text.split(" ")
    stop = f"{words[3][1:]} {words[4][:2]}"  # the tail of word 3, a space, the head of word 4
    (out,) = executor_with_eos().run([PROMPT], greedy(MAX_TOKENS, stop=["never", stop]))
    tokens, text = expected_stop(full.token_ids, stop)
    assert out.finish_reason is FinishReason.STOP
    assert out.token_ids == tokens == full.token_ids[:5]
    assert out.text == text == full.text[: full.text.index(stop)]


def test_stop_string_in_the_prompt_does_not_stop():
    full = unstopped()
    (out,) = executor_with_eos().run([PROMPT], greedy(MAX_TOKENS, stop=[PROMPT]))
    assert PROMPT not in full.text
    assert out.finish_reason is FinishReason.LENGTH
    assert out.token_ids == full.token_ids


# ---- length ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [1, 2, 7])
def test_max_tokens_gives_length_with_exactly_max_tokens_tokens(max_tokens):
    full = unstopped().token_ids
    (out,) = executor_with_eos().run([PROMPT], greedy(max_tokens))
    assert out.finish_reason is FinishReason.LENGTH
    assert out.token_ids == full[:max_tokens]
    assert out.metrics.num_output_tokens == max_tokens


def test_context_length_ends_generation_with_length():
    executor = executor_with_eos(max_model_len=12)
    prompt = make_prompts(1, 9, seed=8)[0]
    (out,) = executor.run([prompt], greedy(100))
    assert out.finish_reason is FinishReason.LENGTH
    assert len(prompt) + len(out.token_ids) == 12


# ---- streaming -------------------------------------------------------------------------------------------


def make_stream_requests():
    return [
        Request(PROMPT, greedy(MAX_TOKENS), request_id="plain"),
        Request("w1 w2 w3 w4 w5 w6 w7", greedy(4), request_id="short"),
        Request(
            [7, 8, 9],
            greedy(MAX_TOKENS, stop_token_ids=[unstopped([7, 8, 9]).token_ids[2]]),
            request_id="stop-token",
        ),
        Request("", greedy(MAX_TOKENS), request_id="bad"),
        Request(list(range(30)), greedy(6), request_id="long-prompt"),
    ]


def test_stream_events_concatenate_to_the_run_output():
    expected = {o.request_id: o for o in executor_with_eos().run(make_stream_requests())}
    # a small token budget: "long-prompt" is prefilled in chunks while the others decode
    events = list(executor_with_eos(max_num_tokens=8).stream(make_stream_requests()))

    for request_id, want in expected.items():
        mine = [e for e in events if e.request_id == request_id]
        assert mine, request_id
        assert [t for e in mine for t in e.token_ids] == want.token_ids, request_id
        assert "".join(e.text for e in mine) == want.text, request_id
        assert [e.finished for e in mine] == [False] * (len(mine) - 1) + [True], request_id
        assert all(e.output is None for e in mine[:-1])
        last = mine[-1].output
        assert last is not None
        assert (last.token_ids, last.finish_reason, last.text, last.error) == (
            want.token_ids,
            want.finish_reason,
            want.text,
            want.error,
        ), request_id
    assert expected["bad"].finish_reason is FinishReason.ERROR
    assert expected["stop-token"].finish_reason is FinishReason.STOP


def test_stream_emits_one_event_per_generated_token_for_greedy_decoding():
    events = list(executor_with_eos().stream([Request(PROMPT, greedy(5), request_id="a")]))
    assert [len(e.token_ids) for e in events] == [1] * 5
    assert events[0].text == unstopped(max_tokens=1).text


def test_streamed_text_never_shows_a_stop_string():
    """Text that may be the start of a stop string must be held back until it is known not to be."""
    full = unstopped()
    words = full.text.split(" ")
    stop = f"{words[3]} {words[4]}"  # two whole words: the first is streamed before the match
    (want,) = executor_with_eos().run([PROMPT], greedy(MAX_TOKENS, stop=[stop]))
    events = list(executor_with_eos().stream([Request(PROMPT, greedy(MAX_TOKENS, stop=[stop]))]))
    streamed = "".join(e.text for e in events)
    assert want.text == full.text[: full.text.index(stop)]
    assert streamed == want.text


def test_closing_a_stream_early_cancels_its_requests():
    """A consumer that stops reading (breaks out of the loop) must not leave its requests running:
    they would hold pages and leak their events into the next stream."""
    executor = executor_with_eos()
    stream = executor.stream([Request(PROMPT, greedy(50), request_id="abandoned")])
    first = next(stream)
    assert first.request_id == "abandoned" and not first.finished
    stream.close()
    assert not executor.core.scheduler.has_unfinished()
    assert executor.block_manager.num_free_blocks == executor.block_manager.num_blocks
    events = list(executor.stream([Request(PROMPT, greedy(2), request_id="next")]))
    assert {e.request_id for e in events} == {"next"}


def test_run_after_stream_starts_clean():
    executor = executor_with_eos()
    list(executor.stream([Request(PROMPT, greedy(3))]))
    (out,) = executor.run([PROMPT], greedy(3))
    assert out.token_ids == unstopped(max_tokens=3).token_ids
    assert out.text == unstopped(max_tokens=3).text
    assert executor.block_manager.num_free_blocks == executor.block_manager.num_blocks


# ---- seeded sampling -------------------------------------------------------------------------------------


def sampled(seed: int | None, max_tokens: int = 16) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, ignore_eos=True)


def test_seeded_sampling_is_reproducible_across_executors_and_seed_dependent():
    (a,) = executor_with_eos().run([PROMPT], sampled(123))
    (b,) = executor_with_eos().run([PROMPT], sampled(123))
    (c,) = executor_with_eos().run([PROMPT], sampled(124))
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
    assert a.token_ids != unstopped(max_tokens=16).token_ids  # it really sampled


def test_seeded_request_does_not_depend_on_its_batch_neighbours():
    (alone,) = executor_with_eos().run([Request(PROMPT, sampled(123))])
    crowd = [Request(p, sampled(None)) for p in make_prompts(3, [4, 9, 2], seed=9)]
    crowd.insert(1, Request(PROMPT, sampled(123), request_id="seeded"))
    crowd.append(Request(PROMPT, sampled(123), request_id="seeded-twin"))
    outputs = {o.request_id: o for o in executor_with_eos().run(crowd)}
    assert outputs["seeded"].token_ids == alone.token_ids
    assert outputs["seeded-twin"].token_ids == alone.token_ids


def test_seeded_sampling_survives_preemption():
    prompts = make_prompts(6, [20, 3, 14, 9, 25, 6], seed=10)
    requests = [Request(p, sampled(100 + i, 12)) for i, p in enumerate(prompts)]
    roomy = executor_with_eos().run(requests)
    tight_executor = executor_with_eos(num_kv_blocks=14)
    tight = tight_executor.run([Request(r.prompt, r.sampling_params) for r in requests])
    assert max(o.metrics.num_preemptions for o in tight) >= 1
    assert [o.token_ids for o in tight] == [o.token_ids for o in roomy]
    assert tight_executor.block_manager.num_free_blocks == tight_executor.block_manager.num_blocks


# ---- metrics ---------------------------------------------------------------------------------------------


def test_metrics_count_tokens_forwards_and_times():
    executor = executor_with_eos(max_num_tokens=8)
    prompts = [list(range(3, 23)), "w1 w2", [5]]
    outputs = executor.run([Request(p, greedy(6)) for p in prompts])
    for prompt, out in zip(prompts, outputs):
        m = out.metrics
        assert m.num_prompt_tokens == len(out.prompt_token_ids) > 0
        if isinstance(prompt, list):
            assert out.prompt_token_ids == prompt
        assert m.num_output_tokens == len(out.token_ids) == 6
        assert m.time_to_first_token is not None and m.time_to_first_token > 0
        assert m.latency is not None and m.latency >= m.time_to_first_token
        assert m.time_per_output_token is not None and m.time_per_output_token > 0
        assert m.num_forwards >= m.num_output_tokens
        assert m.num_preemptions == 0
    # the 20-token prompt took 3 prefill chunks under a budget of 8 tokens
    assert outputs[0].metrics.num_forwards >= 3 + 6 - 1
    assert outputs[2].metrics.num_forwards == 6


def test_generate_convenience_matches_run():
    executor = executor_with_eos()
    (single,) = executor.generate(PROMPT, greedy(MAX_TOKENS))
    assert single.token_ids == unstopped().token_ids
    many = executor.generate([PROMPT, [7, 8, 9]], [greedy(2), greedy(3)])
    assert [len(o.token_ids) for o in many] == [2, 3]
    with pytest.raises(ValueError, match="2 prompts but 1 sampling params"):
        executor.generate([PROMPT, PROMPT], [greedy(MAX_TOKENS)])
