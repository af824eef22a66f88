"""A measurement of this machine taken while other work shared its CPUs is not kept as if it were a
quiet one: an attention choice timed under load once stayed in the cache and made every later decode
row 2.6x slower. Both signals (`timing_noise`): bursts, seen as one work's spread, and steady load, seen
as other processes' CPU time. A noisy measurement is taken once and stored flagged: used while the
machine stays busy, measured again at the first quiet start, so that no start waits for a quiet
machine (measuring twice and caching nothing made every start on a busy machine take minutes)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
from specexec.executor.kernel_plan.measurement import store as measurement_cache
from specexec.executor.kernel_plan.measurement import timing_noise
from specexec.executor.kernel_plan.measurement.journal import measurement_notes, remeasuring
from specexec.executor.kernel_plan.measurement.store import (
    NOISE_FIELD,
    cached_measurement,
    median_seconds,
)


@pytest.fixture
def real_noise_check(monkeypatch, quiet_timing_noise):
    """The noise check as it runs outside the tests (conftest turns it off everywhere else)."""
    monkeypatch.setattr(timing_noise, "_busy_seconds", quiet_timing_noise.busy_seconds)
    monkeypatch.setattr(timing_noise, "NOISY_SPREAD", quiet_timing_noise.noisy_spread)


class Timings:
    """A measurement that times one work whose repeats took the given seconds (a fake clock), and
    counts how often it ran."""

    def __init__(self, *runs: list[float]):
        self.runs = list(runs)
        self.calls = 0

    def __call__(self) -> dict:
        times = self.runs[min(self.calls, len(self.runs) - 1)]
        self.calls += 1
        timing_noise.note_spread(times)
        return {"choice": f"run {self.calls}"}


QUIET = [1.0e-3, 1.1e-3, 1.0e-3, 1.2e-3, 1.0e-3]
#: most repeats of a 14 us kernel caught by a descheduled thread, as in the cached file that did harm
BURSTS = [14e-6, 16e-3, 16e-3, 15e-6, 16e-3]


def cache_files(folder) -> list:
    return sorted(folder.glob("kind-*.json"))


def test_a_burst_of_load_is_seen_in_a_works_spread(real_noise_check):
    _, noise = timing_noise.measure_with_noise(Timings(BURSTS))
    assert noise.spread > 1000 and noise.noisy
    _, noise = timing_noise.measure_with_noise(Timings(QUIET))
    assert noise.spread == pytest.approx(1.0)


def test_median_seconds_reports_its_spread_to_the_measurement_around_it(real_noise_check):
    calls = iter([0.0, 0.03, 0.03, 0.0, 0.03])  # 3 of 5 repeats slowed by 30 ms

    def work():
        time.sleep(next(calls))

    _, noise = timing_noise.measure_with_noise(lambda: {"median": median_seconds(work, 5)})
    assert noise.noisy
    assert median_seconds(lambda: None, 3) >= 0  # outside a measurement: nothing to note, no error


SPIN = "import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"


def measured_beside_a_spinner(own_child: bool):
    """A 1-thread measurement (a sleep: no CPU of its own) on one CPU while a process spins there: one
    this process started (its child) or one that is not (a shell's orphan, adopted by init)."""
    cpu = min(os.sched_getaffinity(0))
    code = SPIN.format(cpu=cpu)
    if own_child:
        spinner = subprocess.Popen([sys.executable, "-c", code])
        pid = spinner.pid
    else:
        started = subprocess.run(
            ["sh", "-c", f'"{sys.executable}" -c "$0" > /dev/null 2>&1 & echo $!', code],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        pid = int(started.stdout)
    try:
        time.sleep(0.3)  # started and pinned
        _, noise = timing_noise.measure_with_noise(lambda: time.sleep(1.0) or {}, threads=1, cpus={cpu})
    finally:
        os.kill(pid, signal.SIGKILL)
        if own_child:
            spinner.wait()
    return noise


needs_proc = pytest.mark.skipif(
    not os.path.exists("/proc/stat"), reason="other processes' CPU time is read from /proc/stat"
)


@needs_proc
def test_steady_load_by_another_process_is_seen_in_its_cpu_time(real_noise_check):
    """A process spinning on the CPU a measurement runs on takes most of it, while every repeat is
    slowed alike (no spread)."""
    noise = measured_beside_a_spinner(own_child=False)
    assert noise.others_share is not None and noise.others_share >= timing_noise.BUSY_SHARE
    assert noise.noisy


@needs_proc
def test_the_measurements_own_child_processes_are_not_other_load(real_noise_check):
    """Tensor-parallel ranks run a measured forward in child processes: their CPU time is the
    measurement's own."""
    noise = measured_beside_a_spinner(own_child=True)
    assert noise.others_share is not None and noise.others_share < timing_noise.BUSY_SHARE


def test_a_quiet_measurement_is_cached_with_its_noise_and_read_back(tmp_path, real_noise_check, monkeypatch):
    monkeypatch.setattr(timing_noise, "_busy_seconds", lambda cpus: None)  # this machine's load: not asked
    measure = Timings(QUIET)
    first = cached_measurement(tmp_path, "kind", "key", measure, "timing", ("choice",))
    again = cached_measurement(tmp_path, "kind", "key", measure, "timing", ("choice",))
    assert measure.calls == 1 and again["choice"] == first["choice"] == "run 1"
    (path,) = cache_files(tmp_path)
    assert json.loads(path.read_text())[NOISE_FIELD]["spread"] == pytest.approx(1.0)


def test_a_noisy_measurement_is_taken_once_and_stored_flagged(
    tmp_path, real_noise_check, monkeypatch, caplog
):
    monkeypatch.setattr(timing_noise, "_busy_seconds", lambda cpus: None)
    measure = Timings(BURSTS, QUIET)
    with caplog.at_level(logging.WARNING, logger="specexec"):
        data = cached_measurement(tmp_path, "kind", "key", measure, "timing", ("choice",))
    assert measure.calls == 1 and data["choice"] == "run 1"
    (path,) = cache_files(tmp_path)
    assert json.loads(path.read_text())[NOISE_FIELD]["noisy"] is True
    assert any(
        "measured again at the next start on a quiet machine" in r.getMessage() for r in caplog.records
    )


def test_a_noisy_measurement_is_used_while_the_machine_is_busy_and_taken_again_once_it_is_quiet(
    tmp_path, real_noise_check, monkeypatch
):
    monkeypatch.setattr(timing_noise, "_busy_seconds", lambda cpus: None)
    measure = Timings(BURSTS, QUIET)
    cached_measurement(tmp_path, "kind", "key", measure, "timing", ("choice",))
    monkeypatch.setattr(timing_noise, "machine_is_busy", lambda: True)
    monkeypatch.setattr(measurement_cache, "machine_is_busy", lambda: True)
    assert cached_measurement(tmp_path, "kind", "key", measure, "timing", ("choice",))["choice"] == "run 1"
    assert measure.calls == 1, "a busy start measured again"
    monkeypatch.setattr(measurement_cache, "machine_is_busy", lambda: False)
    assert cached_measurement(tmp_path, "kind", "key", measure, "timing", ("choice",))["choice"] == "run 2"
    assert measure.calls == 2
    (path,) = cache_files(tmp_path)
    assert json.loads(path.read_text())[NOISE_FIELD]["noisy"] is False
    assert cached_measurement(tmp_path, "kind", "key", measure, "timing", ("choice",))["choice"] == "run 2"
    assert measure.calls == 2, "a quiet measurement was taken again"


@needs_proc
def test_the_busy_check_sees_other_processes_loading_the_cpus(real_noise_check):
    """What a start asks before it uses a measurement stored as noisy: one spinner (not this process's
    child) on each CPU this process may use."""
    pids = []
    for cpu in sorted(os.sched_getaffinity(0)):
        started = subprocess.run(
            ["sh", "-c", f'"{sys.executable}" -c "$0" > /dev/null 2>&1 & echo $!', SPIN.format(cpu=cpu)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        pids.append(int(started.stdout))
    try:
        time.sleep(0.3)
        timing_noise._last_busy_answer.clear()
        assert timing_noise.machine_is_busy(0.5)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        timing_noise._last_busy_answer.clear()


def test_remeasuring_takes_every_measurement_again(tmp_path):
    measure = Timings(QUIET)
    cached_measurement(tmp_path, "kind", "key", measure, "timing", ("choice",))
    with remeasuring():
        assert (
            cached_measurement(tmp_path, "kind", "key", measure, "timing", ("choice",))["choice"] == "run 2"
        )
    assert cached_measurement(tmp_path, "kind", "key", measure, "timing", ("choice",))["choice"] == "run 2"
    assert [n.how for n in measurement_notes()[-3:]] == ["measured", "measured", "stored"]


def test_a_file_cached_before_the_noise_check_is_measured_again(tmp_path):
    """Files written without a noise record may hold a choice made under load (this machine's did)."""
    measure = Timings(QUIET)
    cached_measurement(tmp_path, "kind", "key", measure, "timing", ("choice",))
    (path,) = cache_files(tmp_path)
    record = json.loads(path.read_text())
    del record[NOISE_FIELD]
    path.write_text(json.dumps(record | {"choice": "chosen under load"}))
    data = cached_measurement(tmp_path, "kind", "key", measure, "timing", ("choice",))
    assert data["choice"] == "run 2" and measure.calls == 2


def test_the_attention_kernels_take_turns_while_timed(monkeypatch):
    """The measurement that did harm: each case's kernels alternate, so a busy moment falls on each
    alike instead of on whichever kernel was being timed then."""
    import torch
    from specexec.executor.kernel_plan import attention_path as attention_paths

    order = []
    monkeypatch.setattr(attention_paths, "attend", lambda *args: order.append(args[-1]))
    monkeypatch.setattr(attention_paths, "attend_paged_cpu", lambda *args: order.append("paged_cpu"))
    monkeypatch.setattr(attention_paths, "cpu_kernels", lambda: object())
    monkeypatch.setattr(attention_paths, "CONTEXTS", (16,))
    attention_paths.measure_attention_paths(2, 1, 8, torch.float32, repeats=3)
    first_case = order[: 3 * 4]  # 3 kernels: one warm-up each, then 3 turns
    assert first_case == ["sdpa", "matmul", "paged_cpu"] * 4
