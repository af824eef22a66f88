"""Ctrl-C between steps, not inside one: a step that SIGINT would cut short runs to its end first."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def keyboard_interrupt_after() -> Iterator[None]:
    """Hold a KeyboardInterrupt (the first SIGINT) until the block ends, then raise it; a second SIGINT
    raises at once. Only in the main thread with Python's own SIGINT handler (elsewhere, or with a
    handler of the application's, nothing changes)."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    received: list[int] = []

    def hold(signum, frame) -> None:
        if received:
            raise KeyboardInterrupt
        received.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if received:
        raise KeyboardInterrupt
