"""One loop for every caller. Several threads may call `run()` / `stream()` on one executor at once:
their requests join one waiting queue and run in the same batches, and each caller gets exactly its
own events. Whichever caller is waiting takes the next step (one at a time, under the step lock), so
there is no loop thread; a caller whose requests are done returns while the others go on.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import Protocol

from .engine.engine_core import EngineCore
from .engine.request import TokenEvent
from .interrupts import keyboard_interrupt_after


class EventSink(Protocol):
    """Where a caller's events go: a queue by default, an asyncio hand-over for AsyncExecutor."""

    def put(self, event: TokenEvent) -> None: ...

    def empty(self) -> bool: ...


class Caller:
    """One run() / stream() call (or the add_request() / step() user, or one async request): its
    requests and where its events go (``events``: a queue unless the caller brings its own sink)."""

    def __init__(self, events: EventSink | None = None) -> None:
        self.events: EventSink = events if events is not None else queue.SimpleQueue()
        self.unfinished: set[str] = set()  #: its request ids still running or waiting

    def drain(self) -> list[TokenEvent]:
        """The events queued so far (none for a caller with its own sink: it hands them on as they come)."""
        if not isinstance(self.events, queue.SimpleQueue):
            return []
        events = []
        while True:
            try:
                events.append(self.events.get_nowait())
            except queue.Empty:
                return events


class CallerLoop:
    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._step_lock = threading.Lock()
        self._ids_lock = threading.Lock()
        self._owners: dict[str, Caller] = {}  # request id -> its caller, while unfinished

    def claim(self, request_id: str, caller: Caller) -> bool:
        """Reserve a request id for ``caller``; False when a request with that id is unfinished."""
        with self._ids_lock:
            if request_id in self._owners:
                return False
            self._owners[request_id] = caller
            caller.unfinished.add(request_id)
            return True

    def unclaim(self, request_id: str) -> None:
        with self._ids_lock:
            caller = self._owners.pop(request_id, None)
        if caller is not None:
            caller.unfinished.discard(request_id)

    def unfinished_ids(self) -> list[str]:
        """The ids of every unfinished request (a snapshot)."""
        with self._ids_lock:
            return list(self._owners)

    def drive(self, caller: Caller) -> Iterator[TokenEvent]:
        """The caller's events, stepping the shared loop whenever none are waiting, until its requests
        are finished."""
        while True:
            is_done = not caller.unfinished  # (read first: a request's last event is queued before this)
            events = caller.drain()
            if events:
                yield from events  # the consumer may abort meanwhile: look again before stepping
                continue
            if is_done:
                return
            with self._step_lock:
                if not caller.events.empty():  # another caller's step produced ours meanwhile
                    continue
                if not self.core.has_unfinished():  # (a bug: fail loudly rather than spin)
                    lost = sorted(caller.unfinished)
                    for request_id in lost:
                        self.unclaim(request_id)
                    raise RuntimeError(f"internal error: requests {lost} were lost by the engine")
                self._step()

    def step(self) -> None:
        with self._step_lock:
            self._step()

    def abort(self, request_id: str) -> bool:
        """Finish one request with finish_reason "abort"; False when no such request is unfinished."""
        with self._step_lock:
            event = self.core.abort(request_id)
            if event is not None:
                self._route([event])
            return event is not None

    def abort_all(self) -> None:
        with self._step_lock:
            for request_id in list(self._owners):
                event = self.core.abort(request_id)
                self._route([event] if event is not None else [])

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the loop: no step runs meanwhile."""
        with self._step_lock:
            yield

    def cancel(self, caller: Caller) -> None:
        """Abort every unfinished request of a caller (its run was interrupted or its stream closed)."""
        with self._step_lock:
            for request_id in list(caller.unfinished):
                event = self.core.abort(request_id)
                if event is not None:
                    self._route([event])
                else:  # submitted but refused before reaching the core
                    self.unclaim(request_id)

    def _step(self) -> None:
        with keyboard_interrupt_after():  # (a Ctrl-C during the step is raised after its events are routed)
            self._route(self.core.step())

    def _route(self, events: list[TokenEvent]) -> None:
        for event in events:
            with self._ids_lock:
                caller = self._owners.get(event.request_id)
                if caller is not None and event.finished:
                    del self._owners[event.request_id]
            if caller is not None:
                caller.events.put(event)
                if event.finished:
                    caller.unfinished.discard(event.request_id)
