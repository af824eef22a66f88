"""One process measures a key at a time: processes starting together on one machine (replicas,
tensor-parallel ranks, test workers) would otherwise each time their kernels while the others load the
CPUs, and each measurement would be noisy. The lock is the kernel's (``flock`` on a file beside the
measurement's): it goes with its holder, however that process ends, so none is left behind; a waiter
waits `WAIT_S` at most, then measures on its own."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # (Windows: no flock; each process measures on its own)
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("specexec")

#: the longest a start waits for another process's measurement of the same key (the longest one here,
#: the forward-cost curve of a 0.5B model on 2 cores, takes about 20 s)
WAIT_S = 45.0
POLL_S = 0.1


@contextlib.contextmanager
def held_measurement_lock(path: Path, wait_s: float | None = None) -> Iterator[bool]:
    """Hold the lock of the measurement stored at ``path`` for the block; yields whether another
    process held it first (it may have stored the measurement meanwhile: read it again). Past
    ``wait_s`` (`WAIT_S`) the block runs without the lock, saying so."""
    wait_s = WAIT_S if wait_s is None else wait_s
    lock_path = path.with_name(path.name + ".lock")
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = lock_path.open("a")
    except OSError:
        yield False  # a read-only cache folder: nothing is stored there either
        return
    with handle:
        waited = False
        if fcntl is not None:
            deadline = time.monotonic() + wait_s
            while not _try_lock(handle):
                if not waited:
                    logger.info(
                        "waiting for another process's measurement (%s), %.0f s at most", path.name, wait_s
                    )
                    waited = True
                if time.monotonic() >= deadline:
                    logger.warning(
                        "another process still holds the %s measurement after %.0f s: measuring here too",
                        path.name, wait_s,
                    )  # fmt: skip
                    yield True
                    return
                time.sleep(POLL_S)
        try:
            yield waited
        finally:
            if fcntl is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(handle, fcntl.LOCK_UN)


def _try_lock(handle) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
