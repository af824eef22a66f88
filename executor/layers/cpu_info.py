"""What this machine's CPU is and which of its instruction sets matter to the dtype choice (Linux's
``/proc/cpuinfo``; empty answers elsewhere)."""

from __future__ import annotations

import functools
from pathlib import Path

#: flags of native bfloat16 matrix arithmetic (AVX512-BF16 dot products, AMX tiles)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def _cpuinfo() -> tuple[str, ...]:
    try:
        return tuple(Path("/proc/cpuinfo").read_text().splitlines())
    except OSError:
        return ()


def _first(key: str) -> str:
    return next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith(key)), "")


def cpu_model_name() -> str:
    """E.g. "AMD EPYC" or "Intel(R) Xeon(R) Processor"; "" when unknown."""
    return _first("model name")


def cpu_flags() -> frozenset[str]:
    return frozenset(_first("flags").split())


def native_bf16_flags() -> list[str]:
    """The native-bfloat16 flags this CPU has (empty: bf16 matmuls are emulated, often far slower)."""
    flags = cpu_flags()
    return [f for f in BF16_FLAGS if f in flags]


def describe_cpu() -> str:
    """One line for reports: the model name and the instruction sets that decide speed here."""
    flags = cpu_flags()
    shown = [f for f in ("avx2", "avx512f", "avx512_vnni", *BF16_FLAGS) if f in flags]
    return f"{cpu_model_name() or 'unknown CPU'} ({', '.join(shown) or 'no AVX2'})"


def available_memory_bytes() -> int | None:
    """Memory the kernel says new allocations can take without swapping (``MemAvailable`` in Linux's
    ``/proc/meminfo``); None when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the file counts kB
    except (OSError, ValueError, IndexError):
        return None
    return None
