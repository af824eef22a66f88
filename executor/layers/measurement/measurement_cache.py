"""Measurements of this machine kept across runs (the forward-cost curve, the dtype choice, the attention
kernels): one JSON file per key in the cache folder, measured when missing or unreadable; and the one
timing rule they share.

A measurement taken while other work shares the CPUs can pick the wrong kernel, and a cached choice
would then stay wrong on every later run (an attention choice timed under load made decode rows 2.6x
slower on the AVX512-BF16 EPYC until its file was deleted). So a noisy measurement (`timing_noise`) is
taken again, and if the second is noisy too, the quieter answer is used for this run only: not
cached, and measured again next time. A cached file keeps its measurement's noise (`timing_noise`);
files without it, written before the check, are measured again."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..cpu_info import cpu_key
from ..cpu_kernels import kernels_key
from .timing_noise import measure_with_noise, note_spread

logger = logging.getLogger("specexec")
NOISE_FIELD = "timing_noise"  #: the measurement's `TimingNoise`, kept in its cache file


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
) -> dict:
    """``measure()``'s answer for ``key``, read from ``<cache_dir>/<kind>-<hash>.json`` when the file
    holds every key a fresh answer would (and ``is_stale``, when given, does not reject it); otherwise
    measured (logging ``what``) and written there, unless the machine was busy while it was timed (see
    the module docstring). No cache_dir: always measured."""
    path = None
    if cache_dir is not None:
        path = cache_dir / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
        try:
            cached = json.loads(path.read_text())
        except (OSError, ValueError):
            cached = None
        complete = isinstance(cached, dict) and all(name in cached for name in (*needs, NOISE_FIELD))
        if complete and (is_stale is None or not is_stale(cached)):
            return cached
    logger.info("%s (once%s)", what, f"; cached at {path}" if path else "")
    data, noise = measure_with_noise(measure)
    logger.debug("%s: %s", kind, noise.describe())
    if noise.noisy:
        logger.info("%s: %s (the CPUs were busy): measuring again", kind, noise.describe())
        again, noise_again = measure_with_noise(measure)
        if not noise_again.noisy or noise_again.spread < noise.spread:
            data, noise = again, noise_again
    if noise.noisy:
        logger.warning(
            "the %s measurement ran twice while other work shared the CPUs (%s): its choice holds for "
            "this run only, is not cached, and is measured again next time; for a lasting choice, run "
            "once on a quiet machine",
            kind, noise.describe(),
        )  # fmt: skip
        return data
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            record = {"spread": round(noise.spread, 3), "others_share": noise.others_share}
            path.write_text(json.dumps({"key": key, **data, NOISE_FIELD: record}))
        except OSError as exc:
            logger.warning("could not cache the %s measurement at %s: %s", kind, path, exc)
    return data


def cached_row_ratios(
    cache_dir: Path | None,
    kind: str,
    key: str,
    measure: Callable[[], dict[int, float]],
    what: str,
    field: str = "ratios",
) -> dict[int, float]:
    """A ratio per row count (one kernel's time over another's), as `cached_measurement` keeps it under
    ``field``; a file that does not hold such ratios (one for 1 row at least) is measured again, uncached."""
    data = cached_measurement(cache_dir, kind, key, lambda: {field: measure()}, what, (field,))
    try:
        ratios = {int(n): float(ratio) for n, ratio in data[field].items()}
        if 1 in ratios:
            return ratios
    except (AttributeError, TypeError, ValueError):
        pass
    return measure()  # a damaged cache file
