"""What a start takes for a choice it does not measure (the CPUs busy, or its measuring budget spent:
`measurement/budget.py`) when nothing is stored for this machine: per ISA level of the C++ kernels
(`layers/kernel_build/isa_variants.py`, the one this run loads), the answers measured for SmolLM2-135M-Instruct on a CPU of
that level, written out by `bench/reports/2026-12-02-static-defaults/measure.py` (run it on a quiet machine of the level to
rewrite its entry). Each answer has the measured format of its kind, marked with `STATIC_FIELD`, so
the choice reads it as it reads a measurement; nothing static is ever stored, so the next quiet start
(or `specexec tune`) measures the machine itself.

A level with no entry (AVX-512 without BF16: no such CPU has been drawn here), or a case no entry
holds (another dtype, a quantization not measured), is measured as before, whatever the CPUs do.
"""

from __future__ import annotations

from ..layers.cpu_kernels import installed_variant
from .measurement.store import STATIC_FIELD

#: level -> (where its figures come from, {kind: {case: the answer in that kind's measured format}})
STATIC_DEFAULTS: dict[str, tuple[str, dict[str, dict[str, dict]]]] = {}


def static_default(kind: str, case: str) -> dict | None:
    """This CPU's level's answer for ``kind`` in ``case`` (see `case_name`), or None."""
    variant = installed_variant()  # (SPECEXEC_CPU_MARCH=x86-64-v3: the AVX2 level on a richer CPU)
    if variant is None or variant.name not in STATIC_DEFAULTS:
        return None
    source, kinds = STATIC_DEFAULTS[variant.name]
    answer = kinds.get(kind, {}).get(case)
    if answer is None:
        return None
    return {**answer, STATIC_FIELD: f"the static default for {variant.name} ({source})"}


def case_name(**context) -> str:
    """The case a static answer stands for: the measurement's context (dtype, quantization, ...) that
    changes it, in one string (``dtype=bfloat16|quantization=gguf``)."""
    return "|".join(f"{name}={value}" for name, value in sorted(context.items()))
