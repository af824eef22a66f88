"""Whether an EAGLE-3 head drafts with int8 weights, and in which activation dtype: measured per machine.

The head's forward at batch 1 is a handful of one-row matmuls (fc, q/k/v/o, the MLP and a draft LM head
of 10k+ rows: 42 MB of float32 weights for SmolLM2's head), three forwards a step at k=3. In a profile
of the executor on the 2-core Xeon of 2026-11-27 its linear layers took about 1.6 ms a forward, against
0.69 ms for the same layers timed alone. There, int8 weights with bfloat16 activations took 0.64x of
float32's time (timed alone), and an EAGLE-3 k=3 run on 24 held-out Spec-Bench prompts went from 1.28x
to 1.33x no drafts at the same acceptance length (1.92). With float32 activations the same int8 kernel
took 7.7x float32's time, and on an AVX2-only CPU bfloat16 ran at 0.3 GFLOP/s. So
``head_quantization: auto`` times the head's own layers, one row each, dense in its dtype against int8
in every activation dtype, and takes int8 only where it is clearly faster.

The drafts change a little (the head's logits are rounded), the output does not: the target verifies
every token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.quantized.quantization import quantize_model
from ..layers.quantized.quantized_linear import Int8WeightOnlyLinear
from .measurement.store import (
    cached_measurement,
    interleaved_medians,
    machine_key,
)

SETTINGS = ("auto", "int8", None)
#: int8 is taken where its time is under this share of the dense head's
MARGIN = 0.8
ACTIVATION_DTYPES = (torch.float32, torch.bfloat16)
MEASUREMENT_VERSION = 1


@dataclass(frozen=True, slots=True)
class HeadQuantization:
    """How the head runs: ``scheme`` None (dense, in the target's dtype) or "int8" in ``dtype``."""

    scheme: str | None
    dtype: torch.dtype
    reason: str


def check_setting(value) -> None:
    if value not in SETTINGS:
        raise ValueError(f"head_quantization must be 'auto', 'int8' or null, got {value!r}")


def choose_head_quantization(
    setting: str | None, head: nn.Module, device: torch.device, cache_dir: Path | None
) -> HeadQuantization:
    """The head's weights and activation dtype for ``setting`` (the head as loaded, in the target's
    dtype). ``int8``: int8, on a CPU in the activation dtype measured fastest, elsewhere in the loaded
    dtype; ``auto``: int8 where measured clearly faster on this CPU (dense on CUDA, where the head's
    forward is a replayed graph and launch-bound, and for a float64 head)."""
    dtype = head.norm.weight.dtype
    if setting is None:
        return HeadQuantization(None, dtype, "head_quantization: null")
    if setting == "auto" and device.type != "cpu":
        return HeadQuantization(None, dtype, f"auto: dense on {device.type}")
    if setting == "auto" and dtype not in ACTIVATION_DTYPES:  # (float64: tests of exact drafts)
        return HeadQuantization(None, dtype, f"auto: dense for a {_name(dtype)} head")
    if setting == "int8" and device.type != "cpu":
        return HeadQuantization("int8", dtype, "head_quantization: int8")
    shapes = tuple((m.out_features, m.in_features) for m in head.modules() if type(m) is nn.Linear)
    times = _cached_times(shapes, dtype, cache_dir)
    dense = times[str(dtype)]
    best = min(ACTIVATION_DTYPES, key=lambda d: times[f"int8 {d}"])
    ratio = times[f"int8 {best}"] / dense
    measured = f"int8 with {_name(best)} activations took {ratio:.2f}x the dense {_name(dtype)} head's time"
    if setting == "int8":
        return HeadQuantization("int8", best, f"head_quantization: int8 ({measured})")
    if ratio < MARGIN:
        return HeadQuantization("int8", best, f"auto: int8 ({measured})")
    return HeadQuantization(None, dtype, f"auto: dense ({measured}; int8 needs < {MARGIN}x)")


def apply_head_quantization(head: nn.Module, choice: HeadQuantization) -> nn.Module:
    """The head in ``choice.dtype`` with its dense linear layers int8 (the executor's own
    `quantize_model`), in place (dense: unchanged)."""
    if choice.scheme is None:
        return head
    quantize_model(head.to(choice.dtype), choice.scheme)
    return head


def _cached_times(shapes: tuple[tuple[int, int], ...], dtype: torch.dtype, cache_dir: Path | None) -> dict:
    key = f"v{MEASUREMENT_VERSION}|{machine_key()}|{dtype}|{shapes}"
    names = (str(dtype), *(f"int8 {d}" for d in ACTIVATION_DTYPES))
    return cached_measurement(
        cache_dir,
        "eagle3-head-quantization",
        key,
        lambda: measure_head_linears(shapes, dtype),
        "EAGLE-3 head: timing its layers dense against int8 weights",
        names,
    )


def measure_head_linears(shapes: tuple[tuple[int, int], ...], dtype: torch.dtype, repeats: int = 7) -> dict:
    """Seconds for one row through every layer of ``shapes`` ([out, in] each, random weights): dense in
    ``dtype``, and int8 with each activation dtype; the three take turns (median of ``repeats``)."""
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(out_f, in_f, generator=generator) / in_f**0.5 for out_f, in_f in shapes]
    dense = [w.to(dtype) for w in weights]
    int8 = {d: [_int8(w, d) for w in weights] for d in ACTIVATION_DTYPES}
    rows = {
        d: [torch.randn(1, w.shape[1], generator=generator).to(d) for w in weights] for d in {dtype, *int8}
    }

    def run_dense():
        for x, w in zip(rows[dtype], dense):
            F.linear(x, w)

    works = {str(dtype): run_dense}
    for d, layers in int8.items():
        works[f"int8 {d}"] = lambda d=d, layers=layers: [layer(x) for x, layer in zip(rows[d], layers)]
    for work in works.values():
        work()  # warm-up
    return interleaved_medians(works, repeats, calls_per_turn=3)


def _int8(weight: torch.Tensor, dtype: torch.dtype) -> Int8WeightOnlyLinear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=dtype)
    linear.weight = nn.Parameter(weight.to(dtype), requires_grad=False)
    return Int8WeightOnlyLinear(linear)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
