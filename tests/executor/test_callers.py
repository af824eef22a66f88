"""The front: several threads on one executor, abort_request, interrupts, closed streams, close().

Every scenario ends with every KV page back in the pool and a next call that works.
"""

from __future__ import annotations

import signal
import threading

import pytest
from factories import assert_all_pages_free, tiny_executor
from specexec import Executor, ExecutorConfig, FinishReason, Request, SamplingParams
from specexec.drafters.ngram import NGramDrafter
from tiny_models import make_prompts, make_tiny_model

MAX_TOKENS = 12


def ngram_drafting_executor(isolated_drafter: bool = False, **overrides) -> Executor:
    """The tiny llama drafting with NGram, on the loop's thread unless ``isolated_drafter``."""
    drafter = NGramDrafter(max_draft_len=3)
    drafter.runs_on_loop_thread = not isolated_drafter
    return tiny_executor(drafter=drafter, **{"num_kv_blocks": 100, "max_batch_size": 16, **overrides})


def requests(prompts, max_tokens: int = MAX_TOKENS, prefix: str = "") -> list[Request]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [Request(p, params, f"{prefix}{i}" if prefix else None) for i, p in enumerate(prompts)]


def alone_without_drafts(prompts, max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    """Each prompt alone, without drafts: the tokens every other way of running them must give."""
    _, model = make_tiny_model("llama")
    executor = Executor(model, ExecutorConfig(num_kv_blocks=100, block_size=4, dtype="float64", device="cpu"))
    return [executor.run(requests([p], max_tokens))[0].token_ids for p in prompts]


PROMPTS_A = make_prompts(8, [3, 9, 5, 14], seed=1)
PROMPTS_B = make_prompts(8, [7, 2, 11, 4], seed=2)


def test_two_threads_share_one_loop_and_each_gets_its_own_outputs():
    executor = ngram_drafting_executor()
    results: dict[str, list] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def caller(name, prompts):
        try:
            barrier.wait()
            results[name] = executor.run(requests(prompts, prefix=name))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(n, p)) for n, p in (("a", PROMPTS_A), ("b", PROMPTS_B))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for name, prompts in (("a", PROMPTS_A), ("b", PROMPTS_B)):
        outputs = results[name]
        assert [o.request_id for o in outputs] == [f"{name}{i}" for i in range(len(prompts))]
        assert [o.token_ids for o in outputs] == alone_without_drafts(prompts)
    assert max(o.metrics.num_forwards for o in results["a"]) < 2 * MAX_TOKENS  # batched together, not turns
    assert_all_pages_free(executor)
    assert [o.token_ids for o in executor.run(requests(PROMPTS_A[:2]))] == alone_without_drafts(PROMPTS_A[:2])


def test_a_stream_and_a_run_in_two_threads():
    executor = ngram_drafting_executor()
    outputs: list = []
    worker = threading.Thread(
        target=lambda: outputs.extend(executor.run(requests(PROMPTS_B[:4], prefix="r")))
    )
    streamed: dict[str, list[int]] = {}
    stream = executor.stream(requests(PROMPTS_A[:4], prefix="s"))
    first = next(stream)
    worker.start()
    for event in [first, *stream]:
        streamed.setdefault(event.request_id, []).extend(event.token_ids)
    worker.join(120)
    assert [streamed[f"s{i}"] for i in range(4)] == alone_without_drafts(PROMPTS_A[:4])
    assert [o.token_ids for o in outputs] == alone_without_drafts(PROMPTS_B[:4])
    assert_all_pages_free(executor)


def test_the_same_request_id_in_two_calls_at_once_is_refused_for_the_second():
    executor = ngram_drafting_executor()
    executor.add_request(Request(PROMPTS_A[0], SamplingParams(max_tokens=4), "dup"))
    (out,) = executor.run([Request(PROMPTS_A[1], SamplingParams(max_tokens=4), "dup")])
    assert out.finish_reason is FinishReason.ERROR and "already in use" in out.error
    while executor.core.has_unfinished():
        executor.step()
    assert_all_pages_free(executor)


def test_abort_a_waiting_and_a_running_request():
    executor = ngram_drafting_executor()
    running = executor.add_request(requests([PROMPTS_A[3]], max_tokens=50, prefix="run")[0])
    waiting = executor.add_request(requests([PROMPTS_A[1]], prefix="wait")[0])
    assert executor.abort_request("wait0")  # before any step: still in the queue
    events = executor.step()
    assert [e.request_id for e in events if e.finished] == ["wait0"]
    assert waiting.finish_reason is FinishReason.ABORT and not waiting.token_ids[waiting.num_prompt_tokens :]
    for _ in range(3):
        executor.step()
    held = executor.block_manager.num_blocks - executor.block_manager.num_free_blocks
    assert held > 0 and running.request_id in executor.block_manager.block_tables
    assert executor.abort_request("run0")
    assert_all_pages_free(executor)  # pages back at once, not at the next step
    assert running.finish_reason is FinishReason.ABORT and running.grammar is None
    assert "run0" not in executor.speculation.drafter._indexed  # the drafter forgot it
    (event,) = executor.step()
    assert event.finished and event.output.finish_reason is FinishReason.ABORT
    assert not executor.abort_request("run0") and not executor.abort_request("no-such-id")


def test_a_closed_stream_aborts_what_is_left_of_its_requests():
    executor = ngram_drafting_executor()
    stream = executor.stream(requests(PROMPTS_A[:4], max_tokens=40))
    for _ in range(3):
        next(stream)
    stream.close()
    assert_all_pages_free(executor)
    assert [o.token_ids for o in executor.run(requests(PROMPTS_B[:2]))] == alone_without_drafts(PROMPTS_B[:2])


@pytest.mark.parametrize("how", ["signal", "raise"])
def test_an_interrupt_inside_run_aborts_its_requests_then_propagates(how):
    """Ctrl-C (a real SIGINT) is held until the step ends; a KeyboardInterrupt raised inside a stage
    gives the step up and requeues its batch. Either way the call's requests are aborted, another
    thread's requests in the same batches finish exactly, and the next call works."""
    executor = ngram_drafting_executor()
    runner = executor.core.runner
    forward, calls = runner.forward, [0]

    def interrupting_forward(seqs):  # (in the main thread: where a Ctrl-C arrives)
        is_main = threading.current_thread() is threading.main_thread()
        calls[0] += is_main
        if is_main and calls[0] == 6:
            if how == "signal":
                signal.raise_signal(signal.SIGINT)
            else:
                raise KeyboardInterrupt
        return forward(seqs)

    runner.forward = interrupting_forward
    other: list = []
    errors: list[BaseException] = []

    def run_other():
        try:
            other.extend(executor.run(requests(PROMPTS_B[:3], prefix="t")))
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run_other)
    worker.start()
    with pytest.raises(KeyboardInterrupt):
        executor.run(requests(PROMPTS_A[:4], max_tokens=40, prefix="main"))
    worker.join(120)
    assert not errors, repr(errors)
    assert [o.token_ids for o in other] == alone_without_drafts(PROMPTS_B[:3])
    assert_all_pages_free(executor)
    runner.forward = forward
    assert [o.token_ids for o in executor.run(requests(PROMPTS_A[:2]))] == alone_without_drafts(PROMPTS_A[:2])


def test_close_stops_the_worker_threads_and_refuses_later_calls():
    with ngram_drafting_executor(isolated_drafter=True) as executor:
        executor.run(requests(PROMPTS_A[:2]))  # the drafter's thread starts on its first call
        mask_worker = executor.guided.worker  # (started lazily: by the first guided request)
        stream = executor.stream(requests(PROMPTS_A[:2], max_tokens=30))
        next(stream)
    mask_worker._thread.join(5)
    executor.speculation.guard._thread.join(5)
    assert not mask_worker._thread.is_alive() and not executor.speculation.guard._thread.is_alive()
    assert_all_pages_free(executor)  # close() aborted the open stream's requests
    with pytest.raises(RuntimeError, match="closed"):
        executor.run(requests(PROMPTS_A[:1]))
