"""The async front: one loop thread, requests of all callers batched together, a cancelled consumer
aborts its request, `close()` drains."""

from __future__ import annotations

import asyncio

import pytest
from factories import assert_all_pages_free, drafting_config
from specexec.executor.async_executor import AsyncExecutor, ExecutorClosedError
from specexec.executor.engine.request import FinishReason, Request
from specexec.executor.executor import Executor
from specexec.sampling import SamplingParams
from speculative_runs import BATCHES, reference
from tiny_models import make_tiny_model


def make_engine(**config) -> AsyncExecutor:
    _, model = make_tiny_model("llama")
    return AsyncExecutor(Executor(model, drafting_config(**config)))


async def collect(engine: AsyncExecutor, prompt, max_tokens=16):
    events = [
        e
        async for e in engine.generate(
            Request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        )
    ]
    return events


def test_concurrent_callers_get_their_own_greedy_outputs_batched_together():
    prompts = BATCHES["batch8"]

    async def main():
        engine = make_engine(speculative_config={"decoding_type": "NGram", "max_draft_len": 3})
        steps = []
        step = engine.executor.core.step

        def counting_step():
            events = step()
            steps.append(len({e.request_id for e in events}))
            return events

        engine.executor.core.step = counting_step
        results = await asyncio.gather(*(collect(engine, p) for p in prompts))
        await engine.close()
        return engine, results, steps

    engine, results, steps = asyncio.run(main())
    for events, want in zip(results, reference("llama", prompts)):
        assert events[-1].finished and events[-1].output.finish_reason is FinishReason.LENGTH
        assert [t for e in events for t in e.token_ids] == want == events[-1].output.token_ids
    assert max(steps) > 1, "requests of different callers never shared a step"
    assert_all_pages_free(engine.executor)


def test_a_cancelled_consumer_aborts_its_request_and_frees_its_pages():
    async def main():
        engine = make_engine()
        started = asyncio.Event()

        async def consume():
            async for _ in engine.generate(
                Request([5, 6, 7], SamplingParams(max_tokens=10_000, ignore_eos=True))
            ):
                started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):  # the abort is applied by the loop thread before its next step
            if engine.num_unfinished == 0:
                break
            await asyncio.sleep(0.01)
        other = await collect(engine, [1, 2, 3], max_tokens=4)  # later requests still run
        await engine.close()
        return engine, other

    engine, other = asyncio.run(main())
    assert other[-1].output.finish_reason is FinishReason.LENGTH
    assert engine.num_unfinished == 0
    assert_all_pages_free(engine.executor)


def test_a_bad_request_fails_alone_and_close_drains_then_refuses():
    async def main():
        engine = make_engine()
        bad = await collect(engine, [], max_tokens=4)
        good = asyncio.create_task(collect(engine, [1, 2, 3], max_tokens=8))
        await asyncio.sleep(0)
        await engine.close()  # lets the running request finish
        with pytest.raises(ExecutorClosedError):
            await collect(engine, [1, 2], max_tokens=2)
        return engine, bad, await good

    engine, bad, good = asyncio.run(main())
    assert bad[-1].output.finish_reason is FinishReason.ERROR and "empty" in bad[-1].output.error
    assert good[-1].output.finish_reason is FinishReason.LENGTH and len(good[-1].output.token_ids) == 8


def test_a_request_whose_event_loop_closed_is_aborted_and_the_loop_thread_goes_on():
    """A server stopped at once closes its event loop with requests in flight: their events have
    nowhere to go. They are aborted (pages freed) and later requests, from a new loop, still run."""
    engine = make_engine()
    loop = asyncio.new_event_loop()
    events = engine.generate(Request(BATCHES["batch1"][0], SamplingParams(max_tokens=200, ignore_eos=True)))
    first = loop.run_until_complete(anext(events))
    assert not first.finished
    loop.close()  # (no shutdown_asyncgens: nothing closes the stream, as in a forced exit)
    for _ in range(500):
        if engine.num_unfinished == 0:
            break
        asyncio.run(asyncio.sleep(0.01))
    assert engine.num_unfinished == 0 and not engine.is_closing
    assert_all_pages_free(engine.executor)
    later = asyncio.run(collect(engine, BATCHES["batch1"][0], max_tokens=8))
    assert later[-1].output.finish_reason is FinishReason.LENGTH
    asyncio.run(events.aclose())  # (the abandoned stream, closed for the test's own tidiness)
    asyncio.run(engine.close())
