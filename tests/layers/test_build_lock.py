"""The kernel build lock is taken from a builder only when that builder is gone or has stopped beating,
never by the lock's age: a slow build keeps its lock however long it takes, a killed or frozen one (on
this host or one this process cannot see) does not block the next forever."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension
from specexec.executor.layers import cpu_kernels as kernels_module
from specexec.executor.layers.kernel_build import build_lock

HOLD = """
import sys, time
from pathlib import Path
from specexec.executor.layers.kernel_build.build_lock import held_build_lock
with held_build_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(120)
"""


def start_builder(lock: Path) -> subprocess.Popen:
    """Another process that holds ``lock`` (as a build in progress does) until it is killed."""
    builder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    if builder.stdout.readline().strip() != "held":
        stop(builder)
        pytest.fail("the builder process did not take the lock")
    return builder


def stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()
    process.stdout.close()


def owner_record(**changes) -> dict:
    return {**build_lock.this_process_owner(), **changes}


def test_a_slow_builders_lock_is_waited_on_however_old_and_taken_once_it_is_killed(monkeypatch, tmp_path):
    """The old rule removed torch's lock once older than 10 minutes, and so ran a second build beside
    a slow first one. Here the first builder holds the lock (and torch's, 11 minutes old); the next
    waits, then builds as soon as the first is killed, its locks removed."""
    calls: list[str] = []
    monkeypatch.setenv("SPECEXEC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(kernels_module.SWITCH, raising=False)
    monkeypatch.setattr(torch.utils.cpp_extension, "load", lambda name, **kwargs: calls.append(name))
    monkeypatch.setattr(kernels_module, "installed_library", lambda: None)  # (the build at first use)
    folder = kernels_module.build_folder(kernels_module.build_identity())
    folder.mkdir(parents=True)
    torch_lock = folder / "lock"
    torch_lock.touch()
    old = time.time() - 660
    os.utime(torch_lock, (old, old))
    builder = start_builder(folder / kernels_module.LOCK)
    kernels_module.cpu_kernels.cache_clear()
    waiter = threading.Thread(target=kernels_module.cpu_kernels)
    try:
        waiter.start()
        time.sleep(1.5)
        assert not calls, "a second build started beside a live one"
        assert torch_lock.exists() and (folder / kernels_module.LOCK).exists()
    finally:
        stop(builder)
    waiter.join(timeout=30)
    kernels_module.cpu_kernels.cache_clear()
    assert calls == [folder.name]
    assert not torch_lock.exists() and not (folder / kernels_module.LOCK).exists()


def test_a_lock_is_released_for_the_next_holder(tmp_path):
    lock = tmp_path / "specexec.lock"
    with build_lock.held_build_lock(lock):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()
    with build_lock.held_build_lock(lock):
        assert lock.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "no record left aside"


def test_a_dead_builders_lock_is_stale_and_a_live_ones_is_not(tmp_path):
    lock = tmp_path / "specexec.lock"
    builder = start_builder(lock)
    held_by = json.loads(lock.read_text())
    assert not build_lock.is_stale(held_by, lock)
    stop(builder)
    assert build_lock.is_stale(held_by, lock)


def test_a_process_id_given_to_a_later_process_does_not_hold_the_lock(tmp_path):
    """A builder killed long ago whose id now belongs to another process (here: this one)."""
    lock = tmp_path / "specexec.lock"
    assert not build_lock.is_stale(owner_record(), lock)
    assert build_lock.is_stale(
        owner_record(start=(build_lock.process_start_time(os.getpid()) or 0) + 1), lock
    )


def test_a_lock_from_another_host_or_container_is_waited_on_and_one_from_before_a_reboot_is_not(tmp_path):
    lock = tmp_path / "specexec.lock"
    lock.touch()  # its holder's heartbeat: just now
    assert not build_lock.is_stale(owner_record(host=socket.gethostname() + "-other", pid=2**22 + 7), lock)
    assert not build_lock.is_stale(owner_record(pid_namespace="pid:[1]", pid=2**22 + 7), lock)
    assert build_lock.is_stale(owner_record(boot="an earlier boot"), lock)


@pytest.mark.parametrize(
    "elsewhere",
    [{"host": "another-host"}, {"pid_namespace": "pid:[1]"}, {}],
    ids=["host", "container", "here"],
)
def test_a_holder_whose_heartbeat_stopped_is_taken_over_wherever_it_runs(tmp_path, elsewhere):
    """A holder on another host or in another container cannot be looked up here, and a frozen one
    here still runs: past `HEARTBEAT_STALE_S` without a beat, each lock is taken over."""
    lock = tmp_path / "specexec.lock"
    lock.touch()
    owner = owner_record(**elsewhere)  # (here: this very process, which is alive)
    assert not build_lock.is_stale(owner, lock)
    then = time.time() - build_lock.HEARTBEAT_STALE_S - 1
    os.utime(lock, (then, then))
    assert build_lock.is_stale(owner, lock)
    del owner["heartbeat_s"]  # an older specexec's record, which never beat: its age says nothing
    assert not build_lock.is_stale(owner, lock)


def test_a_holder_beats_while_it_holds_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(build_lock, "HEARTBEAT_S", 0.05)
    lock = tmp_path / "specexec.lock"
    with build_lock.held_build_lock(lock):
        then = time.time() - 600
        os.utime(lock, (then, then))
        time.sleep(0.3)
        assert time.time() - lock.stat().st_mtime < 5
    assert not lock.exists()


@pytest.mark.parametrize("age_s, is_stale", [(1.0, False), (build_lock.UNREADABLE_GRACE_S + 1, True)])
def test_an_unreadable_lock_is_its_writers_for_a_grace_period(tmp_path, age_s, is_stale):
    lock = tmp_path / "specexec.lock"
    lock.write_text("")
    then = time.time() - age_s
    os.utime(lock, (then, then))
    assert build_lock.is_stale(None, lock) is is_stale


def test_of_two_waiters_on_a_dead_builders_lock_one_takes_it_at_a_time(tmp_path):
    """Both see the dead builder's lock; the one that removes it second must not remove the first's
    fresh lock with it."""
    lock = tmp_path / "specexec.lock"
    dead = owner_record(boot="an earlier boot")
    lock.write_text(json.dumps(dead))
    inside: list[int] = []
    overlaps: list[int] = []

    def build() -> None:
        with build_lock.held_build_lock(lock):
            inside.append(1)
            if len(inside) > 1:
                overlaps.append(1)
            time.sleep(0.3)
            inside.pop()

    waiters = [threading.Thread(target=build) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join(timeout=30)
    assert not overlaps and not lock.exists()
