"""The C++ CPU kernels' builds made at install (`setup.py`), one per ISA level, and which one this CPU
runs: the richest whose instructions it reports. Read by the build (with no torch to import: this
module imports nothing of ours or torch's) and by `cpu_kernels.py` at run time.

No variant is built for AMX: no kernel here uses its tiles yet, so an AMX build's code would be the
AVX512-BF16 one's."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

SOURCES = (
    "paged_attention_cpu.cpp",
    "fused_ops_cpu.cpp",
    "quantized/quantized_dot_cpu.cpp",
    "quantized/q8_dequantize_cpu.cpp",
    "prenorm_layer_cpu.cpp",
    "row_summary_cpu.cpp",
)  #: relative to ``executor/layers/``
HEADERS = (
    "float_convert.h",
    "lanes8.h",
    "attention_vectors.h",
    "attention_bf16_dot.h",
    "quantized/tile_layout.h",
    "quantized/q5_values.h",
)  #: included by the sources: part of a build's identity
COMMON_FLAGS = ("-O3", "-fopenmp", "-fno-math-errno", "-std=c++17")  #: (no errno: libm calls vectorize)


def sources_digest(layers: Path) -> str:
    """The sha256 of the sources and headers under ``layers`` (``executor/layers/``): what the build at
    install names its libraries by and what a run asks for, so a source edited since is built anew."""
    texts = [(layers / name).read_text() for name in (*SOURCES, *HEADERS)]
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class IsaVariant:
    name: str  #: the library's suffix: ``_cpu_ops_<name>``
    march_flags: tuple[str, ...]  #: what the compiler targets
    needs: tuple[str, ...]  #: the /proc/cpuinfo flags a CPU must report to run it

    def module(self, sources_digest: str, torch_version: str) -> str:
        """The library's module name, which names what decides its machine code: the sources' digest,
        torch's version and the flags (a library built from other sources or for another torch is
        never loaded: its name is not asked for)."""
        key = "\0".join([sources_digest, torch_version, *COMMON_FLAGS, *self.march_flags])
        return f"_cpu_ops_{self.name}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


#: richest first: a CPU runs the first whose flags it has
VARIANTS = (
    IsaVariant(
        "avx512_bf16",
        ("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16", "-mtune=generic"),
        (
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512dq",
            "avx512vl",
            "avx512cd",
            "avx512_vnni",
            "avx512_bf16",
        ),
    ),
    IsaVariant(
        "avx512_vnni",
        ("-march=x86-64-v4", "-mavx512vnni", "-mtune=generic"),
        ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx512_vnni"),
    ),
    IsaVariant("avx2", ("-march=x86-64-v3", "-mtune=generic"), ("avx2", "fma", "f16c", "bmi2", "movbe")),
)
#: ``SPECEXEC_CPU_MARCH`` values an installed variant stands for (an AVX2-only estimate on a richer CPU)
MARCH_VARIANTS = {"x86-64-v3": "avx2"}


def variant_for(flags: frozenset[str]) -> IsaVariant | None:
    """The richest variant a CPU reporting ``flags`` runs (None: not an x86-64-v3 CPU)."""
    return next((v for v in VARIANTS if all(f in flags for f in v.needs)), None)
