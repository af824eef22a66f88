"""What a start takes for a choice it does not measure (the CPUs busy, or its measuring budget spent:
`measurement/budget.py`) when nothing is stored for this machine: per ISA level of the C++ kernels
(`layers/kernel_build/isa_variants.py`, the one this run loads), the answers measured for SmolLM2-135M-Instruct on a CPU of
that level, written out by that report's `measure.py` into `static_defaults.json` (`bench/reports/2026-12-02-static-defaults/`;
the script left the tree with the reports' internals, `git show 7cc0815:bench/reports/2026-12-02-static-defaults/measure.py`:
run it on a quiet machine of the level to rewrite its entry). Each answer has the measured format of its kind, marked with `STATIC_FIELD`, so
the choice reads it as it reads a measurement; nothing static is ever stored, so the next quiet start
(or `specexec tune`) measures the machine itself.

Entries: ``avx512_bf16`` (a Zen 5 EPYC), ``avx512_bf16+amx`` (a Sapphire Rapids Xeon: oneDNN's bfloat16
runs on its AMX tiles) and ``avx2``, an estimate (the AVX2 builds and ISA limits on that Xeon: no
AVX2-only CPU has been drawn here). A level with no entry (AVX-512 without BF16), or a case no entry
holds (another dtype, a quantization not measured), is measured as before, whatever the CPUs do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..layers.cpu_info import cpu_flags
from ..layers.cpu_kernels import installed_variant
from .measurement.store import STATIC_FIELD

#: level -> {"source": where its figures come from, "kinds": {kind: {case: the answer in that kind's
#: measured format, as the store holds it (JSON: integer keys as strings)}}}
STATIC_DEFAULTS: dict[str, dict] = json.loads((Path(__file__).parent / "static_defaults.json").read_text())


def static_level() -> str | None:
    """This run's level: its C++ kernels' ISA variant (``SPECEXEC_CPU_MARCH=x86-64-v3``: the AVX2 level
    on a richer CPU), with ``+amx`` on an AVX-512 level whose CPU has AMX tiles that oneDNN may use (its
    bfloat16 GEMMs run on them: the dense figures differ from an AVX-512 CPU without), or None."""
    variant = installed_variant()
    if variant is None:
        return None
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if variant.name.startswith("avx512") and "amx_bf16" in cpu_flags() and (not limit or "AMX" in limit):
        return f"{variant.name}+amx"
    return variant.name


def static_default(kind: str, case: str) -> dict | None:
    """This CPU's level's answer for ``kind`` in ``case`` (see `case_name`), or None. A level with AMX
    and no entry of its own takes its AVX-512 level's."""
    level = static_level()
    if level is None:
        return None
    if level not in STATIC_DEFAULTS:
        level = level.removesuffix("+amx")
    if level not in STATIC_DEFAULTS:
        return None
    entry = STATIC_DEFAULTS[level]
    source, kinds = entry["source"], entry["kinds"]
    answer = kinds.get(kind, {}).get(case)
    if answer is None:
        return None
    return {**answer, STATIC_FIELD: f"the static default for {level} ({source})"}


def case_name(**context) -> str:
    """The case a static answer stands for: the measurement's context (dtype, quantization, ...) that
    changes it, in one string (``dtype=bfloat16|quantization=gguf``)."""
    return "|".join(f"{name}={value}" for name, value in sorted(context.items()))
