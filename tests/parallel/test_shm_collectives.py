"""The shared-memory collectives' two promises beyond their sums: they are refused where the CPU may
reorder their plain stores (the ranks then all-reduce through gloo and give the same tokens), and a rank
spinning in one notices its parent is gone instead of spinning until ``tensor_parallel_timeout_s``."""

from __future__ import annotations

import logging
import os
import platform
import signal
import time

import torch
import torch.multiprocessing as mp
from specexec.executor.parallel.gloo_collectives import GlooCollectives
from specexec.executor.parallel.shm_collectives import ShmCollectives
from tensor_parallel_runs import generate, running


def test_off_x86_the_ranks_all_reduce_through_gloo_and_the_log_says_why(monkeypatch, caplog):
    """On aarch64 a peer's slot could arrive after its step counter: the runner takes gloo's collectives,
    warns naming the machine and the reason, and the ranks still give one process's tokens."""
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    chosen = []
    monkeypatch.setattr(GlooCollectives, "__init__", _recording(GlooCollectives.__init__, chosen))
    monkeypatch.setattr(ShmCollectives, "__init__", _recording(ShmCollectives.__init__, chosen))
    with caplog.at_level(logging.WARNING, logger="specexec"):
        tokens = generate("llama", 2)
    assert chosen == ["GlooCollectives"], "one set of collectives, gloo's"
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "aarch64" in warned and "store order" in warned and "gloo" in warned, warned
    monkeypatch.undo()
    assert tokens == generate("llama", 1)


def _recording(init, chosen: list[str]):
    def recorded(self, *args, **kwargs):
        chosen.append(type(self).__name__)
        init(self, *args, **kwargs)

    return recorded


def test_a_rank_spinning_in_a_collective_exits_when_its_parent_is_killed():
    """Rank 0 of 2 waits in an all-reduce rank 1 never joins, with a 60 s timeout; its parent is killed
    with SIGKILL: the rank is gone within 3 s."""
    comm = ShmCollectives(2, 4, torch.float32, timeout_s=60)
    ctx = mp.get_context("spawn")
    started = ctx.Queue()
    parent = ctx.Process(target=start_a_spinning_rank, args=(comm, started))
    parent.start()
    try:
        rank_pid = started.get(timeout=60)
        time.sleep(0.3)
        assert running(rank_pid), "the rank spins in the all-reduce"
    finally:
        parent.kill()
        parent.join()
        parent.close()
        started.close()
        started.join_thread()
        comm.unlink()
    deadline = time.monotonic() + 3
    while running(rank_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left_spinning = running(rank_pid)
    if left_spinning:
        os.kill(rank_pid, signal.SIGKILL)
    assert not left_spinning, "the orphaned rank spun on toward its 60 s timeout"


def start_a_spinning_rank(comm: ShmCollectives, started) -> None:
    """(the parent) start rank 0, then wait to be killed."""
    ctx = mp.get_context("spawn")
    ctx.Process(target=spin_in_an_all_reduce, args=(comm, started)).start()
    time.sleep(600)


def spin_in_an_all_reduce(comm: ShmCollectives, started) -> None:
    """(rank 0) post its part and wait for rank 1's, which never comes."""
    comm.join(0)
    started.put(os.getpid())
    comm.all_reduce(torch.ones(4))
