"""``quantized_kernel:`` — which kernel runs a CPU model's quantized linear layers (int4, int8, GGUF):
torch's weight-only kernels or specexec's int8_dot (`layers/quantized/quantized_dot.py`, which says how
it computes).

- ``auto``: on a CPU where the C++ kernels load, each scheme's layers (int4 and int8 apart: a GGUF's
  Q4_1 layers, its int8 LM head) are run once each, in order (a step's weight traffic), under both
  kernels at each of `MEASURED_ROWS` rows (torch's side as its route runs them: its kernel, or from 128
  rows the dequantized weights' matmul), taking turns; ``int8_dot`` takes a scheme's rows up to the
  last count where it needs under `MARGIN` of torch's time, every smaller count included (all of them:
  every call). Kept in the measurement store per CPU, torch, threads, dtype and the layers' shapes.
  Elsewhere: ``torch``.

What it bought (2-core AMD EPYC Zen 4, AVX512-VNNI; `bench/reports/2026-11-27-int8-dot/`,
`2026-11-27-int8-tiles/`): torch's int4 kernel is 25-60x slower in float32 (the dtype of CPUs without
native bfloat16); in bfloat16 the tiles take 0.55-0.71x its time at one row and 0.60x at 4 over
SmolLM2's layers; torch's int8 kernel takes 3x int8_dot's first layout's time for the 49152x576 LM
head.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from ..layers.cpu_info import describe_cpu
from ..layers.cpu_kernels import fused_ops_take
from ..layers.quantized.quantized_dot import MAX_ROWS, kernel_isa
from .measurement.store import cached_row_ratios, interleaved_medians, machine_key
from .static_defaults import case_name, static_default

QUANTIZED_KERNELS = ("auto", "torch", "int8_dot")
#: rows per timed pass: decode, verify of 1 + k at batch 1-4, larger batches, prefill chunks
MEASURED_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 512)
MARGIN = 0.95  #: int8_dot must take under this fraction of torch's time at a row count to be chosen
CLEARLY_SLOWER = 1.5  #: at this ratio larger row counts are not timed (they only get slower)
#: at this ratio in the warm-up pass, int8_dot is taken for this count and every larger one untimed:
#: torch's float32 int4 path, 25-60x int8_dot's time, would take seconds a pass at 64 rows
CLEARLY_FASTER = 0.25
MEASUREMENT_VERSION = 5  #: bump when the measured work changes: old answers are stale
SCHEMES = ("int4", "int8")


@dataclass(frozen=True, slots=True)
class QuantizedKernelChoice:
    kernel: str  #: torch or int8_dot (for one scheme at least)
    reason: str  #: one line: why (printed by `specexec run`)
    int4_rows: int = 0  #: int4 layers' calls of up to this many rows take int8_dot (0: none)
    int8_rows: int = 0  #: the same for int8 layers

    def rows(self, scheme: str) -> int:
        return self.int4_rows if scheme == "int4" else self.int8_rows


def check_quantized_kernel(value) -> None:
    if value not in QUANTIZED_KERNELS:
        raise ValueError(
            f"config key 'quantized_kernel': got {value!r}; allowed: {', '.join(QUANTIZED_KERNELS)}"
        )


def quantized_layers(module: nn.Module) -> list[nn.Module]:
    """The weight-only quantized layers (`quantized_linear.WeightOnlyLinear`) the int8_dot kernels can
    take, in module order."""
    return [
        m for m in module.modules() if callable(getattr(m, "takes_int8_dot", None)) and m.takes_int8_dot()
    ]


def set_int8_dot(modules, choice: QuantizedKernelChoice | None) -> int:
    """Route each quantized layer of ``modules`` to int8_dot for the rows ``choice`` gives its scheme
    (None or 0 rows: none, and the layer drops the kernel's copies); returns how many layers take it."""
    count = 0
    for module in modules:
        for layer in quantized_layers(module):
            rows = 0 if choice is None else choice.rows(layer.scheme)
            layer.set_int8_dot_rows(rows)
            count += rows > 0
    return count


def choose_quantized_kernel(setting: str, model: nn.Module, cache_dir: Path | None) -> QuantizedKernelChoice:
    """The kernel for ``model``'s quantized layers (see the module docstring)."""
    check_quantized_kernel(setting)
    choice = _choose(setting, model, cache_dir)
    blocks = sum(getattr(m, "scheme", None) == "q8_0" for m in model.modules())
    if blocks:  # a GGUF's Q8_0, Q5_0, Q6_K, Q5_1, Q5_K layers, built only where int8_dot runs: on it whatever the choice
        layers = f"{blocks} int8-block layer{'s' if blocks > 1 else ''} (GGUF Q8_0, Q5_0, Q6_K, Q5_1, Q5_K)"
        note = f"; {layers} on int8_dot (torch has no kernel for them)"
        choice = replace(choice, reason=choice.reason + note)
    return choice


def _choose(setting: str, model: nn.Module, cache_dir: Path | None) -> QuantizedKernelChoice:
    if setting == "torch":
        return QuantizedKernelChoice("torch", "configured")
    layers = quantized_layers(model)
    if not layers:  # (a drafter's dense head, too)
        return QuantizedKernelChoice("torch", f"{setting}: no quantized layer the int8_dot kernels take")
    param = next(model.parameters())
    dtype = param.dtype
    runs = fused_ops_take(param)  # the C++ ops loaded, and this device and dtype theirs
    if setting == "int8_dot":
        if not runs:
            raise ValueError(
                "config key 'quantized_kernel': int8_dot runs on a CPU, in float32, bfloat16 or float16, "
                f"where specexec's C++ kernels load; this model is {str(dtype).removeprefix('torch.')} on "
                f"{param.device.type}"
            )
        return QuantizedKernelChoice("int8_dot", f"configured ({kernel_isa()})", MAX_ROWS, MAX_ROWS)
    if not runs:
        return QuantizedKernelChoice("torch", "auto: int8_dot runs on a CPU where the C++ kernels load")
    by_scheme = {s: [m for m in layers if m.scheme == s] for s in SCHEMES}
    ratios = {s: _cached_ratios(group, dtype, cache_dir) for s, group in by_scheme.items() if group}
    return choice_from_ratios(ratios)


def choice_from_ratios(ratios: dict[str, dict[int, float]]) -> QuantizedKernelChoice:
    """Per scheme, int8_dot up to the last measured row count where it and every smaller count took
    under `MARGIN` of torch's time; past the largest count measured (every one faster) up to
    `MAX_ROWS`."""
    rows, parts = {}, []
    for scheme, by_rows in ratios.items():
        rows[scheme] = 0
        counts = sorted(by_rows)
        for count in counts:
            if by_rows[count] >= MARGIN:
                break
            rows[scheme] = MAX_ROWS if count == counts[-1] else count
        measured = ", ".join(f"{n}: {by_rows[n]:.2f}x" for n in sorted(by_rows))
        verdict = (
            "int8_dot for every call"
            if rows[scheme] == MAX_ROWS
            else f"int8_dot up to {rows[scheme]} rows"
            if rows[scheme]
            else "torch"
        )
        parts.append(f"{scheme} {verdict} (int8_dot's time over torch's by rows {measured})")
    why = f"{'; '.join(parts)} on {describe_cpu()}"
    if not any(rows.values()):
        return QuantizedKernelChoice("torch", f"auto: {why}")
    return QuantizedKernelChoice(
        "int8_dot", f"auto ({kernel_isa()}): {why}", rows.get("int4", 0), rows.get("int8", 0)
    )


@torch.inference_mode()
def measure_ratios(layers: list[nn.Module], dtype: torch.dtype, repeats: int = 5) -> dict[int, float]:
    """int8_dot's time over torch's for one pass over ``layers`` at each of `MEASURED_ROWS` rows, taking
    turns, after an untimed warm-up pass each; counts beyond one where int8_dot took `CLEARLY_SLOWER` x
    torch's time are not timed, nor is any count once a first timed pass finds int8_dot under
    `CLEARLY_FASTER` x torch's time (that ratio kept)."""
    for layer in layers:
        layer.set_int8_dot_rows(MAX_ROWS)  # builds the kernel's copies for the timing
    generator = torch.Generator().manual_seed(0)
    ratios = {}
    for rows in MEASURED_ROWS:
        inputs = {
            n: torch.randn(rows, n, generator=generator).to(dtype) for n in {m.in_features for m in layers}
        }
        works = {
            "torch": lambda inputs=inputs: [m.without_int8_dot(inputs[m.in_features]) for m in layers],
            "int8_dot": lambda inputs=inputs: [m._int8_dot(inputs[m.in_features]) for m in layers],
        }
        for work in works.values():
            work()  # warm-up: one-time work (torch's scale tables per dtype) stays out of the timing
        first = {}
        for name, work in works.items():  # one timed pass each decides the clear cases
            started = time.perf_counter()
            work()
            first[name] = time.perf_counter() - started
        if first["int8_dot"] < CLEARLY_FASTER * first["torch"]:
            ratios[rows] = first["int8_dot"] / first["torch"]
            break
        median = interleaved_medians(works, repeats)
        ratios[rows] = median["int8_dot"] / median["torch"]
        if ratios[rows] >= CLEARLY_SLOWER:
            break
    return ratios


def _cached_ratios(layers: list[nn.Module], dtype: torch.dtype, cache_dir: Path | None) -> dict[int, float]:
    shapes = sorted({(m.scheme, m.in_features, m.out_features) for m in layers})
    key = f"v{MEASUREMENT_VERSION}|{machine_key()}|{dtype}|layers={len(layers)}|{shapes}"
    return cached_row_ratios(
        cache_dir,
        "quantized-kernel",
        key,
        lambda: measure_ratios(layers, dtype),
        "quantized_kernel auto: timing the int8_dot kernels against torch's on this CPU",
        default=static_default("quantized-kernel", case_name(scheme=layers[0].scheme, dtype=dtype)),
    )
