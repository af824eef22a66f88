"""Whether a measurement of this machine ran while other work shared its CPUs, by two signals:

- the spread of each timed work: its median repeat over its fastest (bursts of load: a descheduled
  thread made single repeats of a 14 us attention kernel take 16 ms on the 2-core EPYC);
- the CPU time other processes (not this one's children, such as tensor-parallel ranks) took on the
  CPUs this process may run on, beyond the CPUs torch's threads leave spare, as a share of those
  threads (steady load, which slows every repeat alike and leaves the spread low: under a second
  2-thread process the worst spread of the attention timing was 1.4x while it picked SDPA for 7 cases
  of 8 that the C++ kernel wins on a quiet machine). Read from ``/proc/stat``; elsewhere only the
  spread counts.

A measurement is noisy when its worst spread reaches `NOISY_SPREAD` or others took `BUSY_SHARE` of
its threads' CPUs. On a quiet 2-core EPYC the worst spread of any measurement stayed under 1.5x and
others took 0-1%; under a second 2-thread process, 50%."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

import torch

NOISY_SPREAD = 2.0  #: a timed work whose median repeat took this many times its fastest
BUSY_SHARE = 0.2  #: a share of the CPUs' time taken by other processes while measuring
_worst_spread: ContextVar[list[float] | None] = ContextVar("worst_spread", default=None)


@dataclass(frozen=True, slots=True)
class TimingNoise:
    spread: float  #: the worst timed work's median over its fastest (1.0 when nothing was timed)
    others_share: float | None  #: of the CPUs torch's threads need, the share others took; None: unknown

    @property
    def noisy(self) -> bool:
        return self.spread >= NOISY_SPREAD or (self.others_share or 0.0) >= BUSY_SHARE

    def describe(self) -> str:
        others = (
            "" if self.others_share is None else f", other processes took {self.others_share:.0%} of its CPUs"
        )
        return f"a timing's median was {self.spread:.2f}x its fastest{others}"


def note_spread(times: list[float]) -> None:
    """Count one work's repeated timings toward the measurement running now (if any)."""
    worst = _worst_spread.get()
    if worst is None or len(times) < 2:
        return
    fastest = min(times)
    if fastest > 0:
        worst[0] = max(worst[0], sorted(times)[len(times) // 2] / fastest)


def measure_with_noise(
    measure: Callable[[], dict], threads: int | None = None, cpus: set[int] | None = None
) -> tuple[dict, TimingNoise]:
    """``measure()``'s answer and how noisy the machine was while it ran, for ``threads`` (torch's by
    default) on ``cpus`` (those this process may run on by default)."""
    threads = threads or torch.get_num_threads()
    cpus = cpus or _own_cpus()
    worst = [1.0]
    token = _worst_spread.set(worst)
    busy_before, own_before, wall_before = _busy_seconds(cpus), _own_seconds(), time.perf_counter()
    try:
        data = measure()
    finally:
        _worst_spread.reset(token)
    wall = time.perf_counter() - wall_before
    busy_after, own = _busy_seconds(cpus), _own_seconds() - own_before
    share = None
    if busy_before is not None and busy_after is not None and wall > 0:
        others = (busy_after - busy_before - own) / wall  # CPUs' worth of other processes' work
        spare = max(0, len(cpus) - threads)  # CPUs torch's threads leave to others
        share = max(0.0, others - spare) / min(threads, len(cpus))
    return data, TimingNoise(worst[0], share)


def _own_seconds() -> float:
    """CPU seconds of this process and of its live children (tensor-parallel ranks run a measured
    forward in child processes: their work is the measurement's own, not other load)."""
    seconds = time.process_time()
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except (OSError, ValueError, AttributeError):
        return seconds
    me = os.getpid()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = (
                    stat.read().rsplit(")", 1)[1].split()
                )  # after the command name, which may hold spaces
        except OSError:
            continue  # gone, or not ours to read
        if int(fields[1]) == me:  # fields: state, ppid, ..., utime (12), stime (13)
            seconds += (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def _own_cpus() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _busy_seconds(cpus: set[int]) -> float | None:
    """CPU seconds spent not idle on ``cpus`` since boot (user, nice, system, irq, softirq and steal:
    a hypervisor's steal is time our virtual CPU did not get), or None without ``/proc/stat``."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.read().splitlines()
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    busy = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
        busy += user + nice + system + irq + softirq + steal
    return busy / ticks


BUSY_CHECK_S = 0.25  #: how long `machine_is_busy` watches the CPUs
#: a start asks once for all its stored measurements: the answer holds this long
BUSY_ANSWER_S = 10.0
_last_busy_answer: list[tuple[float, bool]] = []


def machine_is_busy(seconds: float = BUSY_CHECK_S) -> bool:
    """Whether other processes take `BUSY_SHARE` of the CPUs torch's threads need, watched for
    ``seconds`` while this process sleeps (False where ``/proc/stat`` cannot say); an answer is
    reused for `BUSY_ANSWER_S`."""
    now = time.monotonic()
    if _last_busy_answer and now - _last_busy_answer[-1][0] < BUSY_ANSWER_S:
        return _last_busy_answer[-1][1]
    _, noise = measure_with_noise(lambda: time.sleep(seconds) or {})
    busy = (noise.others_share or 0.0) >= BUSY_SHARE
    _last_busy_answer[:] = [(time.monotonic(), busy)]
    return busy
