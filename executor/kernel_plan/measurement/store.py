"""This machine's measurements (the forward-cost curve, the dtype choice, the kernels' row ratios, the
attention paths), kept across runs: one JSON file per key in the cache folder, measured when missing or
unreadable; and the one timing rule they share.

A measurement taken while other work shares the CPUs can pick the wrong kernel (an attention choice
timed under load made decode rows 2.6x slower on the AVX512-BF16 EPYC), but measuring again until the
machine is quiet made a start on a machine that never is (two replicas starting together, a laptop)
take minutes: each start measured twice and cached nothing. So a start measures once and stores what
it measured with its noise (`timing_noise`); one flagged noisy is used as long as the machine is busy
and measured again at the first start that finds it quiet (or by `specexec tune`). Processes starting
together measure each key once: one holds its lock (`measurement_lock.py`, a deadline on every wait)
and the others read its file. Files without a noise record, written before the check, are measured
again."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ...layers.cpu_info import cpu_key
from ...layers.cpu_kernels import kernels_key
from .budget import why_not_measure
from .journal import is_remeasuring, note_measurement
from .lock import held_measurement_lock
from .timing_noise import machine_is_busy, measure_with_noise, note_spread

logger = logging.getLogger("specexec")
NOISE_FIELD = "timing_noise"  #: the measurement's `TimingNoise`, kept in its cache file
STATIC_FIELD = "static_default"  #: in an answer that was not measured here: which static default it is


def machine_key() -> str:
    """The part of every measurement's key that names the machine and its code: this CPU's features
    (`cpu_key`: not its model name alone, which a VM shares with CPUs that differ in AVX-512 and AMX),
    torch's version and its threads, and the C++ kernels' build (`kernels_key`: a kernel changed by an
    upgrade is measured again, not timed by its predecessor's figures), and the vector width torch's own
    kernels were held to (``ATEN_CPU_CAPABILITY``: an estimate of an AVX2-only CPU times them apart)."""
    return (
        f"{cpu_key()}|torch {torch.__version__}|threads={torch.get_num_threads()}|kernels {kernels_key()}"
        f"|aten {torch.backends.cpu.get_cpu_capability()}"
    )


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The median wall time of ``repeats`` calls of ``fn`` (warm it up first)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    note_spread(times)
    return sorted(times)[len(times) // 2]


def interleaved_medians(works: dict, repeats: int, calls_per_turn: int = 1) -> dict:
    """The median seconds of each of ``works`` (key -> callable), all taking turns ``repeats`` times in
    the dict's order, each turn the median of ``calls_per_turn`` calls, so that a machine's drift falls
    on each alike. Warm them up first."""
    times: dict = {key: [] for key in works}
    for _ in range(repeats):
        for key, work in works.items():
            times[key].append(median_seconds(work, calls_per_turn))
    for values in times.values():
        note_spread(values)
    return {key: sorted(values)[len(values) // 2] for key, values in times.items()}


def cached_measurement(
    cache_dir: Path | None,
    kind: str,
    key: str,
    measure: Callable[[], dict],
    what: str,
    needs: tuple[str, ...],
    is_stale: Callable[[dict], bool] | None = None,
    default: dict | None = None,
) -> dict:
    """``measure()``'s answer for ``key``, read from ``<cache_dir>/<kind>-<hash>.json`` when the file
    holds every key a fresh answer would (and ``is_stale``, when given, does not reject it); otherwise
    measured once (logging ``what``) and stored there, with its noise (see the module docstring).
    ``default``: this ISA's static answer (`static_defaults.py`, marked with `STATIC_FIELD`), taken
    instead of measuring where the start's budget is spent or other work takes the CPUs
    (`budget.why_not_measure`); nothing is stored then. No cache_dir: always measured."""
    if cache_dir is None:
        return _measure_and_note(kind, key, measure, what, None)
    path = cache_dir / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if not is_remeasuring() and (stored := _stored(kind, path, needs, is_stale)) is not None:
        return stored
    if default is not None and (why := why_not_measure()) is not None:
        logger.info("%s: %s and nothing is stored for this machine: %s", kind, why, default[STATIC_FIELD])
        note_measurement(kind, f"static default ({why})", 0.0, None)
        return default
    with held_measurement_lock(path) as waited:
        if (
            waited
            and not is_remeasuring()
            and (stored := _stored(kind, path, needs, is_stale, accept_noisy=True))
        ):
            return stored  # another process measured it while this one waited
        return _measure_and_note(kind, key, measure, what, path)


def _stored(
    kind: str, path: Path, needs: tuple[str, ...], is_stale, accept_noisy: bool = False
) -> dict | None:
    """The stored measurement, if complete and current. One taken while other work shared the CPUs is
    used as long as the machine is still busy (or, ``accept_noisy``, always: another process has just
    measured it); on a quiet machine it is measured again."""
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(cached, dict) and all(name in cached for name in (*needs, NOISE_FIELD))):
        return None
    noise = cached[NOISE_FIELD]
    if not isinstance(noise, dict):
        return None
    if noise.get("noisy") and not accept_noisy:
        if not machine_is_busy():
            logger.info(
                "%s was measured while the CPUs were busy; the machine is quiet now: measuring again",
                path.name,
            )
            return None
        note_measurement(kind, "stored (measured while busy)", 0.0, path)
        return cached
    if is_stale is not None and is_stale(cached):
        return None
    note_measurement(kind, "stored", 0.0, path)
    return cached


def _measure_and_note(kind: str, key: str, measure: Callable[[], dict], what: str, path: Path | None) -> dict:
    """Measure once; store the answer at ``path`` with its noise (flagged ``noisy`` where other work
    shared the CPUs, so that a quiet start or `specexec tune` measures it again: the start itself never
    waits for a quiet machine, nor measures twice)."""
    logger.info("%s (once%s)", what, f"; stored at {path}" if path else "")
    started = time.perf_counter()
    data, noise = measure_with_noise(measure)
    seconds = time.perf_counter() - started
    logger.debug("%s: %s (%.1f s)", kind, noise.describe(), seconds)
    if noise.noisy:
        logger.warning(
            "the %s measurement ran while other work shared the CPUs (%s): its choice is used, and "
            "measured again at the next start on a quiet machine, or by `specexec tune`",
            kind, noise.describe(),
        )  # fmt: skip
    note_measurement(kind, "measured while busy" if noise.noisy else "measured", seconds, path)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            record = {
                "spread": round(noise.spread, 3),
                "others_share": noise.others_share,
                "noisy": noise.noisy,
            }
            aside = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            aside.write_text(json.dumps({"key": key, **data, NOISE_FIELD: record}))
            aside.replace(path)  # (a reader never sees half a file)
        except OSError as exc:
            logger.warning("could not store the %s measurement at %s: %s", kind, path, exc)
    return data


def cached_row_ratios(
    cache_dir: Path | None,
    kind: str,
    key: str,
    measure: Callable[[], dict[int, float]],
    what: str,
    field: str = "ratios",
    default: dict | None = None,
) -> dict[int, float]:
    """A ratio per row count (one kernel's time over another's), as `cached_measurement` keeps it under
    ``field``; a file that does not hold such ratios (one for 1 row at least) is measured again, uncached."""
    data = cached_measurement(
        cache_dir, kind, key, lambda: {field: measure()}, what, (field,), default=default
    )
    try:
        ratios = {int(n): float(ratio) for n, ratio in data[field].items()}
        if 1 in ratios:
            return ratios
    except (AttributeError, TypeError, ValueError):
        pass
    return measure()  # a damaged cache file
