"""Processes that start together (replicas, tensor-parallel ranks) measure each key once: one holds the
measurement's lock, the others wait for its file, and none waits past the lock's deadline."""

from __future__ import annotations

import threading
import time

from specexec.executor.kernel_plan.measurement import lock as measurement_lock
from specexec.executor.kernel_plan.measurement.store import cached_measurement


class SlowMeasurement:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.calls = 0

    def __call__(self) -> dict:
        self.calls += 1
        time.sleep(self.seconds)
        return {"choice": f"run {self.calls}"}


def measure_at_once(tmp_path, measure, starts: int = 2) -> list[dict]:
    results: list[dict] = []

    def start():
        results.append(cached_measurement(tmp_path, "kind", "key", measure, "timing", ("choice",)))

    threads = [threading.Thread(target=start) for _ in range(starts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


def test_starts_at_the_same_moment_measure_a_key_once_and_read_one_answer(tmp_path):
    measure = SlowMeasurement(0.5)
    results = measure_at_once(tmp_path, measure, starts=3)
    assert measure.calls == 1
    assert [r["choice"] for r in results] == ["run 1"] * 3


def test_a_start_waits_for_another_measurement_only_until_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(measurement_lock, "WAIT_S", 0.3)
    measure = SlowMeasurement(1.5)
    started = time.monotonic()
    results = measure_at_once(tmp_path, measure)
    assert measure.calls == 2, "the waiter did not measure on its own past the deadline"
    assert time.monotonic() - started < 1.5 + 0.3 + 1.0  # the second ran beside the first, not after it
    assert len(results) == 2


def test_a_lock_goes_with_its_holder(tmp_path):
    path = tmp_path / "kind-0.json"
    with measurement_lock.held_measurement_lock(path) as waited:
        assert not waited
    with measurement_lock.held_measurement_lock(path, wait_s=0.1) as waited:
        assert not waited  # released: the next one takes it at once
