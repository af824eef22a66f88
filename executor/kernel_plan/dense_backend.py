"""``cpu_linear:`` — which kernels run a CPU model's dense linear layers.

- ``blas``: ``F.linear`` as loaded (torch's BLAS: MKL in its CPU wheels).
- ``onednn``: oneDNN on weights packed once at start-up (`packed_linear.py`), the target's and the
  drafter's models alike.
- ``auto``: on a CPU, for a model in a dtype oneDNN packs here, one decode step's work for the model's
  shapes (`dtype_choice.DecodeStepWork`: every layer's projections, attention, the LM head) is timed
  under both at each of `MEASURED_ROWS` new tokens (a decode step, verify steps of 1 + k drafts at
  small batches, prefill chunks). oneDNN takes the row counts where it needs under `ONEDNN_MARGIN` of
  the BLAS's time, each up to the next measured count: everywhere -> ``onednn``; nowhere -> ``blas``;
  some -> ``blas+onednn``, both copies of each dense weight kept and the kernel picked per call by its
  rows (`packed_linear.RowBands`). Cached per CPU, torch version, thread count, model shape, dtype and
  quantization, like the dtype choice. On CUDA, and for dtypes oneDNN does not pack here (float64,
  float16, bfloat16 without the instructions): ``blas``.
- ``auto`` with a drafter, in float32 where torch has MKL: the target's verify at batch 1 (1 + k rows, k
  the drafter's ``max_draft_len``) is also timed on MKL's packed GEMM for exactly those rows; it takes
  them (``+mkl``, one more copy of each dense target weight) when it needs under `MKL_MARGIN` of the
  other choice's time there.
- The copies beside the one a single kernel needs must fit in `MEMORY_SHARE` of the memory available
  (`fit_in_memory`): else MKL's copy is dropped first, then the row bands (for the kernel that runs one
  row), and the reason says so.

Why it matters to speculation: the verify forward multiplies 1 + k rows by every weight. On the AVX2
EPYC measured (`packed_linear.py`), MKL took 1.8x a decode step's linear time for 4 rows, oneDNN 1.17x;
on an AVX-512 Xeon MKL is the faster at 1-3 rows and oneDNN at 4, hence the bands.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from ..layers.cpu_info import describe_cpu
from ..layers.packed_linear import PackedLinear, RowBands, can_pack, can_pack_mkl
from .dtype import DecodeStepWork, ModelShape
from .measurement.store import (
    cached_measurement,
    cached_row_ratios,
    interleaved_medians,
    machine_key,
)
from .static_defaults import case_name, static_default

CPU_LINEARS = ("auto", "blas", "onednn")
ONEDNN_MARGIN = 0.9  #: oneDNN must take under this fraction of the BLAS's time to be chosen
#: MKL's packed GEMM must take under this fraction of the other choice's time at the verify rows. The
#: whole step's work is timed (attention, norms), so a linear-only gain of 12% shows as about 8%.
MKL_MARGIN = 0.95
MEMORY_SHARE = 0.5  #: extra weight copies may take at most this share of the memory available
MEASUREMENT_VERSION = 2  #: bump when the measured work changes: old answers are stale
#: new tokens per timed step: decode; verify of 1 + k drafts at batch 1-4 (k = 1..7 lands in these
#: bands); prefill chunks. Each count stands for the rows up to the next.
MEASURED_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128)


@dataclass(frozen=True, slots=True)
class LinearBackendChoice:
    #: blas, onednn, or blas+onednn (each call's kernel by its rows: ``bands``); +mkl: ``mkl_rows`` too
    backend: str
    reason: str  #: one line: why (printed by `specexec run`)
    bands: RowBands | None = None  #: for blas+onednn: which rows run on oneDNN
    mkl_rows: int | None = None  #: for +mkl: the target's calls of this many rows run on MKL's packed GEMM


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
    verify_rows: int | None = None,
) -> LinearBackendChoice:
    """The backend for a model on ``device`` in ``dtype`` (see the module docstring); a ValueError names
    the key when ``onednn`` is asked for where it cannot run. ``verify_rows``: 1 + the drafter's
    ``max_draft_len`` (None without a drafter)."""
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
    shape = ModelShape.from_config(shape_config)
    choice = choice_from_ratios(_cached_onednn_ratios(shape, dtype, cache_dir, quantization))
    if verify_rows is None or verify_rows < 2 or not can_pack_mkl(dtype):
        return choice
    bands = choice.bands
    on_onednn = choice.backend == "onednn" or (bands is not None and bands.uses_onednn(verify_rows))
    other = "onednn" if on_onednn else "blas"
    ratio = _cached_mkl_ratio(shape, dtype, cache_dir, quantization, verify_rows, other)
    named = "oneDNN" if other == "onednn" else "the BLAS"
    verdict = f"MKL's packed GEMM at {verify_rows} rows took {ratio:.2f}x {named}'s time"
    if ratio >= MKL_MARGIN:
        return replace(choice, reason=f"{choice.reason}; {verdict}")
    if choice.backend == "blas":
        bands = RowBands((1,), (False,))  # every other row count on the BLAS
    reason = f"{choice.reason}; {verdict}: the target's {verify_rows}-row verify runs on it"
    return LinearBackendChoice(f"{choice.backend}+mkl", reason, bands, verify_rows)


def choice_from_ratios(ratios: dict[int, float]) -> LinearBackendChoice:
    """The auto choice from oneDNN's time over the BLAS's at each measured number of rows."""
    rows = sorted(ratios)
    is_onednn = tuple(ratios[n] < ONEDNN_MARGIN for n in rows)
    measured = ", ".join(f"{n}: {ratios[n]:.2f}x" for n in rows)
    why = f"oneDNN's time over the BLAS's by rows {measured} on {describe_cpu()}"
    if all(is_onednn):
        return LinearBackendChoice("onednn", f"auto: {why}")
    if not any(is_onednn):
        return LinearBackendChoice("blas", f"auto: {why}")
    changes = [i for i in range(len(rows)) if i == 0 or is_onednn[i] != is_onednn[i - 1]]
    bands = RowBands(tuple(rows[i] for i in changes), tuple(is_onednn[i] for i in changes))
    return LinearBackendChoice("blas+onednn", f"auto: {bands.describe()} ({why})", bands)


def extra_copies(choice: LinearBackendChoice) -> int:
    """Copies of each dense target weight beyond one: the dense one kept beside oneDNN's, MKL's."""
    both = choice.bands is not None and any(choice.bands.is_onednn)
    return int(both) + int(choice.mkl_rows is not None)


def fit_in_memory(
    choice: LinearBackendChoice, weight_bytes: int, available: int | None
) -> LinearBackendChoice:
    """``choice``, or a choice with fewer weight copies, whose extra copies of the target's ``weight_bytes``
    of dense linear weights take at most `MEMORY_SHARE` of ``available`` bytes (None: not known, kept)."""
    if available is None or extra_copies(choice) * weight_bytes <= MEMORY_SHARE * available:
        return choice
    copies = extra_copies(choice)
    note = (
        f"{choice.reason}; not kept: {copies} more cop{'y' if copies == 1 else 'ies'} of "
        f"{weight_bytes / 2**20:.0f} MiB of weights would exceed {MEMORY_SHARE:.0%} of the "
        f"{available / 2**20:.0f} MiB available"
    )
    if choice.mkl_rows is not None:  # MKL's copy goes first
        backend = choice.backend.removesuffix("+mkl")
        bands = None if backend == "blas" else choice.bands
        fewer = LinearBackendChoice(backend, f"{note} (MKL's packed GEMM dropped)", bands)
        if extra_copies(fewer) * weight_bytes <= MEMORY_SHARE * available:
            return fewer
    bands = choice.bands
    one_row_on_onednn = choice.backend.startswith("onednn") or (bands is not None and bands.uses_onednn(1))
    single = "onednn" if one_row_on_onednn else "blas"
    return LinearBackendChoice(single, f"{note} (one kernel: {single})")


def _measurement_key(shape: ModelShape, dtype: torch.dtype, quantization: str | None) -> str:
    """What a cached timing depends on: this CPU, torch, threads, the model's shape, dtype and weights."""
    return f"v{MEASUREMENT_VERSION}|{machine_key()}|{shape}|{dtype}|quantization={quantization}"


def _cached_onednn_ratios(
    shape: ModelShape, dtype: torch.dtype, cache_dir: Path | None, quantization: str | None
) -> dict[int, float]:
    return cached_row_ratios(
        cache_dir,
        "linear-backend",
        _measurement_key(shape, dtype, quantization),
        lambda: measure_onednn_ratios(shape, dtype, quantization),
        "cpu_linear auto: timing oneDNN's packed linears against the BLAS on this CPU",
        field="onednn_ratios",
        default=static_default("linear-backend", case_name(dtype=dtype, quantization=quantization)),
    )


def _cached_mkl_ratio(
    shape: ModelShape,
    dtype: torch.dtype,
    cache_dir: Path | None,
    quantization: str | None,
    rows: int,
    other: str,
) -> float:
    data = cached_measurement(
        cache_dir,
        "linear-backend-mkl",
        f"{_measurement_key(shape, dtype, quantization)}|rows={rows}|against={other}",
        lambda: {"mkl_ratio": measure_mkl_ratio(shape, dtype, rows, other, quantization)},
        f"cpu_linear auto: timing MKL's packed GEMM at {rows} rows on this CPU",
        ("mkl_ratio",),
        default=static_default(
            "linear-backend-mkl", case_name(dtype=dtype, quantization=quantization, rows=rows, against=other)
        ),
    )
    try:
        return float(data["mkl_ratio"])
    except (TypeError, ValueError):  # a damaged cache file: measure again, uncached
        return measure_mkl_ratio(shape, dtype, rows, other, quantization)


def measure_mkl_ratio(
    shape: ModelShape,
    dtype: torch.dtype,
    rows: int,
    other: str,
    quantization: str | None = None,
    repeats: int = 7,
) -> float:
    """MKL's packed GEMM's time over ``other``'s (blas or onednn) for one step's work at ``rows`` new
    tokens, interleaved."""
    works = {"mkl": _step_work("mkl", shape, dtype, quantization, rows)}
    works[other] = _step_work(other, shape, dtype, quantization)
    median = _interleaved_medians(works, (rows,), repeats)
    return median["mkl", rows] / median[other, rows]


def measure_onednn_ratios(
    shape: ModelShape, dtype: torch.dtype, quantization: str | None = None, repeats: int = 5
) -> dict[int, float]:
    """oneDNN's time over the BLAS's for one decode step's work at each of `MEASURED_ROWS` new tokens,
    the two interleaved so that a machine's drift falls on both."""
    works = {kernel: _step_work(kernel, shape, dtype, quantization) for kernel in ("blas", "onednn")}
    median = _interleaved_medians(works, MEASURED_ROWS, repeats)
    return {n: median["onednn", n] / median["blas", n] for n in MEASURED_ROWS}


def _step_work(
    kernel: str, shape: ModelShape, dtype: torch.dtype, quantization: str | None, mkl_rows: int | None = None
) -> DecodeStepWork:
    """One decode step's work with its dense layers on ``kernel``: blas (as built), onednn, or mkl
    (MKL's packed GEMM for ``mkl_rows``, the BLAS for other counts)."""
    work = DecodeStepWork(shape, dtype, quantization)
    if kernel != "blas":
        bands = RowBands((1,), (False,)) if kernel == "mkl" else None
        work.map_linears(
            lambda layer: PackedLinear(layer, bands, mkl_rows) if type(layer) is nn.Linear else layer
        )
    return work


def _interleaved_medians(
    works: dict[str, DecodeStepWork], rows: tuple[int, ...], repeats: int
) -> dict[tuple[str, int], float]:
    """The median seconds of each work at each row count, all of them taking turns ``repeats`` times
    (after one warm-up at the first count) so that a machine's drift falls on each alike."""
    for work in works.values():
        work.run(rows[0])  # warm-up
    turns = {(name, n): (lambda w=work, n=n: w.run(n)) for n in rows for name, work in works.items()}
    return interleaved_medians(turns, repeats)
