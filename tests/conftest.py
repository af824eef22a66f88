"""Lets the test modules import the shared helpers (`tiny_models`, ...) in tests/."""

import os
import sys
from pathlib import Path
from types import SimpleNamespace

_TESTS = Path(__file__).resolve().parent
# The shared helpers (factories, tiny_models, speculative_runs, ...) sit in tests/; the folders below
# mirror the code, and a test module imports helpers from tests/ only (tests/house/test_tests_layout.py).
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

import pytest  # noqa: E402

# imported before any test module: it takes the checkout's root (where `python -m pytest` runs) off sys.path
import specexec  # noqa: E402,F401
import torch  # noqa: E402

# The tiny test models are far faster on one thread; several threads on a busy 2-core machine
# spend their time contending with each other.
torch.set_num_threads(1)


def cores_per_worker() -> int:
    """This machine's cores shared among pytest-xdist's workers (the suite runs ``-n auto``: one worker a
    core): a worker's test that took every core would make each core run two busy threads, and torch's
    threads, waiting at every op for the slowest, ran the real model 10x slower so (597 s, not 51)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 1) // workers)


@pytest.fixture
def all_threads():
    """The real model wants every core this worker has (the tiny models above run on one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(cores_per_worker())
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def quiet_timing_noise(monkeypatch):
    """Whether a measurement is cached must not hang on what else this machine runs during a test: the
    noise check (`timing_noise`) sees a quiet machine here, except in `test_timing_noise.py`, which
    tests it."""
    from specexec.executor.kernel_plan.measurement import timing_noise

    real = SimpleNamespace(busy_seconds=timing_noise._busy_seconds, noisy_spread=timing_noise.NOISY_SPREAD)
    monkeypatch.setattr(timing_noise, "_busy_seconds", lambda cpus: None)
    monkeypatch.setattr(timing_noise, "NOISY_SPREAD", float("inf"))
    return real


@pytest.fixture
def cpu_ops_built():
    """For tests of specexec's C++ CPU kernels: fail, never skip, where they did not build (every machine
    these tests run on has a compiler; CI sets SPECEXEC_CPU_KERNELS=1 besides)."""
    from specexec.executor.layers.cpu_kernels import cpu_kernels

    if cpu_kernels() is None:
        pytest.fail(
            "specexec's C++ CPU kernels did not build here (see the log); this machine has a compiler"
        )
