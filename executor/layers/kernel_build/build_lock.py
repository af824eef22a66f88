"""A lock on a build folder that says who holds it and beats while held, so that one left by a dead
or frozen builder is taken over and one held by a slow builder never is.

torch's own build lock (an empty ``lock`` file) says nothing of its holder: a process killed while it
built (Ctrl-C, a stopped tensor-parallel worker) leaves it behind and every later build waits on it
forever, and removing it by age races a build that is only slow. This lock's file records its
holder's process id, start time, host, boot and process-id namespace, and its holder touches it every
`HEARTBEAT_S` while it holds it. It is taken over (with a warning) when that process is gone (the same
host, boot and namespace, and no live process with that id and start time), when the machine has
rebooted since, or when its heartbeat is older than `HEARTBEAT_STALE_S`: a holder this process cannot
see (another host sharing the home folder, another container) or one that is frozen is waited on that
long at most, never forever.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger("specexec")

POLL_S = 0.2  #: how often a waiting process looks at the lock again
#: an owner record that cannot be read (a writer killed between creating and writing it, where the
#: file system has no hard links) is its writer's for this long, then stale
UNREADABLE_GRACE_S = 60.0
BREAK_STALE_S = 10.0  #: far longer than a stale lock's removal, which holds the ``.break`` file
HEARTBEAT_S = 5.0  #: how often a holder touches its lock
#: a lock whose holder has not touched it for this long is its holder's no more (a live holder, however
#: slow its build, touches it every `HEARTBEAT_S`)
HEARTBEAT_STALE_S = 60.0


@contextlib.contextmanager
def held_build_lock(lock: Path) -> Iterator[None]:
    """Hold ``lock`` for the block: wait while a live process holds it, take over one whose holder
    is gone."""
    owner = this_process_owner()
    has_waited = False
    while not _try_create(lock, owner):
        held_by = _read_owner(lock)
        if is_stale(held_by, lock):
            _remove_if_unchanged(lock, held_by)
            continue
        if not has_waited:
            logger.warning("waiting for the build lock %s (held by %s)", lock, held_by)
            has_waited = True
        time.sleep(POLL_S)
    stop = threading.Event()
    beat = threading.Thread(
        target=_beat, args=(lock, owner, stop), name="specexec-lock-heartbeat", daemon=True
    )
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        if _read_owner(lock) == owner:
            lock.unlink(missing_ok=True)


def _beat(lock: Path, owner: dict, stop: threading.Event) -> None:
    """Touch ``lock`` every `HEARTBEAT_S` while this process holds it (``owner`` in it)."""
    while not stop.wait(HEARTBEAT_S):
        if _read_owner(lock) != owner:
            return  # taken over (this process was frozen past the stale age): not ours to touch
        with contextlib.suppress(OSError):
            os.utime(lock)


def this_process_owner() -> dict:
    """The record this process writes into a lock it holds (``token``: unique to this hold)."""
    return {
        "pid": os.getpid(),
        "start": process_start_time(os.getpid()),
        "host": socket.gethostname(),
        "boot": boot_id(),
        "pid_namespace": pid_namespace(),
        "token": uuid.uuid4().hex,
        "heartbeat_s": HEARTBEAT_S,
    }


def is_stale(owner: dict | None, lock: Path) -> bool:
    """Whether the process that ``owner`` names is gone, so that its lock can go (None: the record
    could not be read; stale once `UNREADABLE_GRACE_S` has passed)."""
    if owner is None:
        try:
            return time.time() - lock.stat().st_mtime > UNREADABLE_GRACE_S
        except FileNotFoundError:
            return False  # released meanwhile: try again
    if "heartbeat_s" in owner and _heartbeat_age(lock) > HEARTBEAT_STALE_S:
        return True  # its holder, wherever it runs, stopped touching it: gone or frozen
    if owner.get("host") != socket.gethostname():
        return False  # another machine's process: its heartbeat says when it is gone
    if owner.get("boot") != boot_id():
        return True  # the machine rebooted since: every process of then is gone
    if owner.get("pid_namespace") != pid_namespace():
        return False  # another container's process: its id means nothing here, its heartbeat does
    return not is_running(owner.get("pid"), owner.get("start"))


def _heartbeat_age(lock: Path) -> float:
    """Seconds since ``lock`` was last touched (0 where it is gone: released meanwhile)."""
    try:
        return time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def is_running(pid: object, start: object) -> bool:
    """Whether process ``pid`` lives (not a zombie) and, where its start time was recorded, is the
    same process (not a later one given the same id)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it lives
    stat = _proc_stat(pid)
    if stat is None:
        return True  # no /proc (macOS): the id alone says it
    state, started = stat
    return state != "Z" and (start is None or started == start)


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (Linux); None where /proc cannot say."""
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


def boot_id() -> str:
    """This boot's id (Linux); "" elsewhere."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    """This process's process-id namespace ("pid:[4026531836]"; Linux), "" elsewhere: containers on
    one host share its name and boot, not their process ids."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``pid``'s state letter and start time from ``/proc/<pid>/stat`` (after its name, which can hold
    spaces and parentheses: the state is the first field past the last ")", the start time the 20th)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _try_create(lock: Path, owner: dict) -> bool:
    """Create ``lock`` holding ``owner`` if no lock is there: written aside and hard-linked in, so the
    lock never exists without its record (where hard links are refused, created and then written)."""
    aside = lock.with_name(f"{lock.name}.{owner['token']}")
    aside.write_text(json.dumps(owner))
    try:
        os.link(aside, lock)
        return True
    except FileExistsError:
        return False
    except OSError:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(owner))
        return True
    finally:
        aside.unlink(missing_ok=True)


def _read_owner(lock: Path) -> dict | None:
    try:
        owner = json.loads(lock.read_text())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _remove_if_unchanged(lock: Path, stale: dict | None) -> None:
    """Remove the stale lock unless it changed since it was judged. Two waiters can judge one dead
    builder's lock at once: the first removes it and takes a fresh one, which the second must not
    remove. So a remover holds a second, short lock (the ``.break`` file, held for a read and an
    unlink: one that is `BREAK_STALE_S` old was left by a remover that died there)."""
    breaker = lock.with_name(f"{lock.name}.break")
    try:
        fd = os.open(breaker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):
            if time.time() - breaker.stat().st_mtime > BREAK_STALE_S:
                breaker.unlink()
        return
    try:
        if _read_owner(lock) == stale:
            logger.warning("removed a build lock whose process is gone (%s): %s", stale, lock)
            lock.unlink(missing_ok=True)
    finally:
        os.close(fd)
        breaker.unlink(missing_ok=True)
