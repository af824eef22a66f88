"""The one path into a drafter: every call is contained, held to a deadline, and counted.

A call that raises returns its default (its requests lose their drafts for that step; the first
fault is logged with its traceback). A drafter is *isolated* unless it says it runs on the loop's
thread: its calls run on the guard's own daemon thread and the loop waits at most ``deadline_s``; a
late call returns its default too, and while it is still running the drafter is not called again (its
calls return their defaults at once), so even a call that never returns costs one deadline per step.
A drafter that runs on the loop's thread (the built-in ones: on CPU a second thread's OpenMP team slows
a drafter's model by about a quarter) has its deadline checked when the call returns: a late answer is
dropped. A drafter late ``MAX_CONSECUTIVE_LATE`` times in a row is switched off for the executor's life
(logged once). Without a deadline every call runs on the loop's thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

logger = logging.getLogger("specexec")

T = TypeVar("T")
#: consecutive late calls (or steps skipped because a late call is still running) before switch-off
MAX_CONSECUTIVE_LATE = 3


class DrafterGuard:
    def __init__(self, name: str, deadline_s: float | None, isolated: bool = True) -> None:
        self.name = name  #: the drafter's class name, for the log
        self.deadline_s = deadline_s
        self.isolated = isolated and deadline_s is not None  #: calls run on the guard's thread
        self.is_enabled = True
        self.num_errors = 0  #: calls that raised
        self.num_late = 0  #: calls that missed the deadline, or were skipped while one was late
        self._consecutive_late = 0
        self._late: Future | None = None  # the call that missed its deadline, while it still runs
        self._logged_error = False
        self._jobs: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None

    def call(self, what: str, fn: Callable[[], T], default: T) -> T:
        """``fn()``'s result, or ``default`` if it raised, was late, or the drafter is off or busy."""
        if not self.is_enabled:
            return default
        if not self.isolated:
            return self._inline(what, fn, default)
        if self._late is not None:
            if not self._late.done():
                self._count_late(what)
                return default
            self._late = None
        future: Future = Future()
        self._submit(future, lambda: self._contained(what, fn, default))
        try:
            result = future.result(timeout=self.deadline_s)
        except FutureTimeout:
            self._late = future
            self._count_late(what)
            return default
        self._consecutive_late = 0
        return result

    def call_each(self, what: str, fn: Callable[[Any], None], items: list) -> bool:
        """``fn(item)`` for every item in one call (one thread hop), each contained on its own;
        False when the call did not run (the drafter is off, busy or late)."""

        def each() -> bool:
            for item in items:
                self._contained(what, lambda item=item: fn(item), None)
            return True

        return bool(items) and self.call(what, each, False)

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.put(None)

    def _inline(self, what: str, fn: Callable[[], T], default: T) -> T:
        start = time.perf_counter()
        result = self._contained(what, fn, default)
        if self.deadline_s is not None and time.perf_counter() - start > self.deadline_s:
            self._count_late(what)
            return default
        self._consecutive_late = 0
        return result

    def _contained(self, what: str, fn: Callable[[], T], default: T) -> T:
        try:
            return fn()
        except Exception:
            self.num_errors += 1
            if not self._logged_error:
                self._logged_error = True
                logger.exception(
                    "drafter %s raised in %s; its requests go on without drafts", self.name, what
                )
            return default

    def _count_late(self, what: str) -> None:
        self.num_late += 1
        self._consecutive_late += 1
        if self._consecutive_late == 1:
            logger.warning(
                "drafter %s: %s took over %s s; no drafts this step", self.name, what, self.deadline_s
            )
        if self._consecutive_late >= MAX_CONSECUTIVE_LATE:
            self.is_enabled = False
            logger.error(
                "drafter %s missed its %s s deadline %d times in a row; switched off for this executor",
                self.name,
                self.deadline_s,
                self._consecutive_late,
            )

    def _submit(self, future: Future, fn: Callable[[], Any]) -> None:
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            self._thread = threading.Thread(
                target=self._serve, args=(self._jobs,), name="drafter", daemon=True
            )
            self._thread.start()
        self._jobs.put((future, fn))

    def __del__(self) -> None:
        self.close()  # the thread holds only the queue: it ends with its guard

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while (job := jobs.get()) is not None:
            future, fn = job
            try:
                future.set_result(fn())
            except BaseException as exc:  # (fn is contained: only a KeyboardInterrupt-like exit lands here)
                future.set_exception(exc)
            del job, future, fn  # hold nothing of the drafter's while idle
