"""The async front (for the server): one background thread runs the shared loop; ``generate`` yields a
request's events from an asyncio queue, and the requests of every caller run in the same batches.

    async with AsyncExecutor(Executor(config=...)) as engine:
        async for event in engine.generate(prompt, SamplingParams(max_tokens=64)):
            print(event.text, end="")

A request is submitted (tokenized, its chat template rendered, its grammar queued) in one worker thread,
in the order of arrival, so the event loop goes on meanwhile (``/health`` answered while a long prompt
is tokenized); a submit that fails after the request's id was claimed aborts what it queued and frees
the id before the error propagates.

Cancelling the consumer (or closing the generator) aborts its request: the abort is handed to the loop
thread, which frees the request's pages before its next step. `close()` stops taking requests, lets the
running ones finish (up to a deadline, then aborts them), stops the loop and closes the executor.

Which thread steps: by default a background thread. ``start_thread=False`` leaves it to the caller's
`run_loop()`, for a process's main thread: torch's CPU kernels run slower from any other thread (its
OpenMP pool; measured here in bfloat16, 2 cores: a step took 1.7x as long, 123 against 232 tok/s), so
`specexec serve` steps in the main thread and runs the HTTP server beside it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from ..sampling import SamplingParams
from .caller_loop import Caller
from .engine.request import Prompt, Request, TokenEvent
from .executor import Executor

logger = logging.getLogger("specexec")


class ExecutorClosedError(RuntimeError):
    """The async executor no longer takes requests (it is closing or closed)."""


class _QueueEvents:
    """A caller's event sink that hands each event to an asyncio queue on its event loop. When that loop
    has closed (its server stopped at once, with the request in flight) nobody reads the events: the
    request is aborted through ``on_gone(request_id)`` instead, and the executor's loop goes on."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, on_gone) -> None:
        self._loop, self._queue, self._on_gone = loop, queue, on_gone

    def put(self, event: TokenEvent) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop is closed
            if not event.finished:
                self._on_gone(event.request_id)

    def empty(self) -> bool:  # (CallerLoop.drive reads it; async callers are never driven)
        return True


class AsyncExecutor:
    """An `Executor` driven by a background thread, for asyncio callers."""

    def __init__(self, executor: Executor, *, start_thread: bool = True) -> None:
        self.executor = executor
        self._wake = threading.Condition()
        self._aborts: list[str] = []  # request ids to abort before the next step
        self._accepting = True
        self._stopping = False
        self._fault: str | None = None  # set when the loop died: every later call fails
        self._loop_done = threading.Event()
        #: submits, one at a time in arrival order, off the event loop (tokenization can take seconds)
        self._submitter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specexec-submit")
        self._num_submitting = 0  #: generate() calls whose submit has not returned (close() waits for them)
        if start_thread:
            threading.Thread(target=self.run_loop, name="specexec-loop", daemon=True).start()

    # ---- what callers use -----------------------------------------------------------------------
    @property
    def is_closing(self) -> bool:
        """True once `close()` began (or the loop thread died): new requests are refused."""
        return not self._accepting or self._fault is not None

    @property
    def num_unfinished(self) -> int:
        """Requests waiting or running (the server's queue limit counts these)."""
        return sum(self.executor.queue_sizes())

    async def generate(
        self,
        request: Request | Prompt,
        sampling_params: SamplingParams | None = None,
        on_submitted: Callable[[], None] | None = None,
    ) -> AsyncIterator[TokenEvent]:
        """The request's events as they are generated; the last has ``finished`` and ``output``. A bad
        request yields one finished event with ``finish_reason="error"``. With ``n`` > 1 the samples'
        events interleave (``sample_index``), each sample's last one ``finished``. ``on_submitted`` is
        called once the samples are queued (they count in `num_unfinished` from then on) or refused."""
        if not self._accepting or self._fault is not None:
            raise ExecutorClosedError(self._fault or "the executor is closing: no new requests")
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        caller = Caller(events=_QueueEvents(loop, queue, self.abort))
        submitted = loop.run_in_executor(self._submitter, self._submit, request, sampling_params, caller)
        self._num_submitting += 1
        try:
            samples = await asyncio.shield(submitted)
        except asyncio.CancelledError:  # the consumer went away: abort what the submit queues
            submitted.add_done_callback(lambda _: [self.abort(i) for i in list(caller.unfinished)])
            raise
        finally:
            self._num_submitting -= 1
            if on_submitted is not None:
                on_submitted()
        self._notify()
        unfinished = {s.request_id for s in samples}
        try:
            while unfinished:
                event = await queue.get()
                if event.finished:
                    unfinished.discard(event.request_id)
                yield event
        finally:
            for request_id in unfinished:  # cancelled, or the consumer stopped: abort on the loop thread
                self.abort(request_id)

    def _submit(self, request: Request | Prompt, sampling_params: SamplingParams | None, caller: Caller):
        """(In the submit thread.) The request's samples queued in the engine; on any error, what was
        queued is aborted and every id claimed is freed before it propagates (a tokenizer's TypeError on
        a lone surrogate left its request id registered for ever)."""
        try:
            return self.executor.submit(request, sampling_params, caller, streaming=True)
        except BaseException as exc:
            self.executor.cancel(caller)
            if self.is_closing and isinstance(exc, Exception):
                raise ExecutorClosedError(self._fault or "the executor is closing: no new requests") from exc
            raise

    def drain(self) -> None:
        """Stop taking requests (from any thread, a signal handler's too); those in flight go on.
        `is_closing` is True from now on."""
        self._accepting = False

    def abort(self, request_id: str) -> None:
        """Abort a request (from any thread, without waiting for the step in flight)."""
        with self._wake:
            self._aborts.append(request_id)
            self._wake.notify()

    async def close(self, timeout_s: float = 30.0) -> None:
        """Stop taking requests, let the running ones finish for up to ``timeout_s`` seconds, abort the
        rest, stop the loop thread and close the executor."""
        self._accepting = False
        deadline = time.monotonic() + timeout_s
        while (
            (self.num_unfinished or self._num_submitting)
            and time.monotonic() < deadline
            and not self._loop_done.is_set()
        ):
            await asyncio.sleep(0.02)
        self.stop_loop()
        await asyncio.to_thread(self._loop_done.wait)
        await asyncio.to_thread(self._submitter.shutdown, wait=True, cancel_futures=True)
        self.executor.close()

    def stop_loop(self) -> None:
        """Make `run_loop()` abort what is unfinished and return (close() calls it)."""
        self._accepting = False
        with self._wake:
            self._stopping = True
            self._wake.notify()

    async def __aenter__(self) -> AsyncExecutor:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    # ---- the loop thread ------------------------------------------------------------------------
    def _notify(self) -> None:
        with self._wake:
            self._wake.notify()

    def run_loop(self) -> None:
        """Step the shared loop whenever a request is unfinished, until `stop_loop()` (or `close()`)."""
        try:
            while True:
                with self._wake:
                    while not (self._stopping or self._aborts or self.executor.has_unfinished()):
                        self._wake.wait()
                    aborts, self._aborts = self._aborts, []
                    if self._stopping:
                        self.executor.abort_all()
                        return
                for request_id in aborts:
                    self.executor.abort_request(request_id)
                if self.executor.has_unfinished():
                    self.executor.advance()
        except BaseException as exc:  # a bug in the loop itself: fail every request, take no more
            self._fault = f"the executor's loop stopped: {type(exc).__name__}: {exc}"
            logger.exception("the async executor's loop stopped")
            self.executor.abort_all()
            if not isinstance(exc, Exception):
                raise
        finally:
            self._loop_done.set()
