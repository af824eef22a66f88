"""``cpu_linear:`` — which kernels run a CPU model's dense linear layers.

- ``blas``: ``F.linear`` as loaded (torch's BLAS: MKL in its CPU wheels).
- ``onednn``: oneDNN on weights packed once at start-up (`packed_linear.py`), the target's and the
  drafter's models alike.
- ``auto``: on a CPU, for a model in a dtype oneDNN packs here, one decode step's work for the model's
  shapes (`dtype_choice.DecodeStepWork`: every layer's projections, attention, the LM head) is timed at
  1 and 4 new tokens — a decode step and a verify step of 3 drafts — under both; ``onednn`` wins when it
  takes under `ONEDNN_MARGIN` of ``blas``'s time. Cached per CPU, torch version, thread count, model
  shape, dtype and quantization, like the dtype choice. On CUDA, and for dtypes oneDNN does not pack
  here (float64, float16, bfloat16 without the instructions): ``blas``.

Why it matters to speculation: the verify forward multiplies 1 + k rows by every weight. On the AVX2
EPYC measured (`packed_linear.py`), MKL took 1.8x a decode step's linear time for 4 rows, oneDNN 1.17x.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .cpu_info import describe_cpu
from .dtype_choice import DecodeStepWork, ModelShape
from .measurement_cache import cached_measurement, median_seconds
from .packed_linear import PackedLinear, can_pack

CPU_LINEARS = ("auto", "blas", "onednn")
ONEDNN_MARGIN = 0.9  #: oneDNN must take under this fraction of the BLAS's time to be chosen
MEASUREMENT_VERSION = 1  #: bump when the measured work changes: old answers are stale
MEASURED_ROWS = (1, 4)  #: new tokens per timed step: decode, and verify of 3 drafts


@dataclass(frozen=True, slots=True)
class LinearBackendChoice:
    backend: str  #: blas or onednn
    reason: str  #: one line: why (printed by `specexec run`)


def check_cpu_linear(value) -> None:
    if value not in CPU_LINEARS:
        raise ValueError(f"config key 'cpu_linear': got {value!r}; allowed: {', '.join(CPU_LINEARS)}")


def choose_linear_backend(
    setting: str,
    device: torch.device,
    dtype: torch.dtype,
    shape_config: dict,
    cache_dir: Path | None,
    quantization: str | None = None,
) -> LinearBackendChoice:
    """The backend for a model on ``device`` in ``dtype`` (see the module docstring); a ValueError names
    the key when ``onednn`` is asked for where it cannot run."""
    check_cpu_linear(setting)
    packable = device.type == "cpu" and can_pack(dtype)
    if setting == "blas":
        return LinearBackendChoice("blas", "configured")
    if setting == "onednn":
        if not packable:
            raise ValueError(
                f"config key 'cpu_linear': onednn cannot run a {str(dtype).removeprefix('torch.')} model "
                f"on {device.type}{'' if device.type != 'cpu' else f' ({describe_cpu()})'}; "
                "use auto or blas"
            )
        return LinearBackendChoice("onednn", "configured")
    if not packable:
        where = "CUDA" if device.type != "cpu" else f"{str(dtype).removeprefix('torch.')} on this CPU"
        return LinearBackendChoice("blas", f"auto: oneDNN packing does not apply ({where})")
    ratio = _cached_onednn_ratio(ModelShape.from_config(shape_config), dtype, cache_dir, quantization)
    verdict = "onednn" if ratio < ONEDNN_MARGIN else "blas"
    return LinearBackendChoice(verdict, f"auto: oneDNN took {ratio:.2f}x the BLAS's time on {describe_cpu()}")


def _cached_onednn_ratio(
    shape: ModelShape, dtype: torch.dtype, cache_dir: Path | None, quantization: str | None
) -> float:
    key = (
        f"v{MEASUREMENT_VERSION}|{describe_cpu()}|torch {torch.__version__}|threads={torch.get_num_threads()}"
        f"|{shape}|{dtype}|quantization={quantization}"
    )
    data = cached_measurement(
        cache_dir,
        "linear-backend",
        key,
        lambda: {"onednn_ratio": measure_onednn_ratio(shape, dtype, quantization)},
        "cpu_linear auto: timing oneDNN's packed linears against the BLAS on this CPU",
        ("onednn_ratio",),
    )
    try:
        return float(data["onednn_ratio"])
    except (TypeError, ValueError):  # a damaged cache file: measure again, uncached
        return measure_onednn_ratio(shape, dtype, quantization)


def measure_onednn_ratio(
    shape: ModelShape, dtype: torch.dtype, quantization: str | None = None, repeats: int = 5
) -> float:
    """oneDNN's time over the BLAS's for one decode step's work at `MEASURED_ROWS` new tokens (summed),
    the two interleaved so that a machine's drift falls on both."""
    blas = DecodeStepWork(shape, dtype, quantization)
    onednn = DecodeStepWork(shape, dtype, quantization)
    onednn.map_linears(lambda layer: PackedLinear(layer) if type(layer) is nn.Linear else layer)
    works = {"blas": blas, "onednn": onednn}
    for work in works.values():
        work.run(1)  # warm-up
    times: dict[tuple[str, int], list[float]] = {(name, n): [] for name in works for n in MEASURED_ROWS}
    for _ in range(repeats):
        for rows in MEASURED_ROWS:
            for name, work in works.items():
                times[name, rows].append(median_seconds(lambda w=work, n=rows: w.run(n), 1))
    median = {key: sorted(values)[len(values) // 2] for key, values in times.items()}
    return sum(median["onednn", n] for n in MEASURED_ROWS) / sum(median["blas", n] for n in MEASURED_ROWS)
