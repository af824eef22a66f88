"""What this machine's CPU is and which of its instruction sets matter to the dtype choice (Linux's
``/proc/cpuinfo``; empty answers elsewhere), and the key that tells one CPU from another for what is
cached per CPU: the model name alone does not (a VM's "Intel(R) Xeon(R) Processor" hides which
AVX-512 and AMX sets it has; aarch64 has no model name at all)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

#: flags of native bfloat16 matrix arithmetic (AVX512-BF16 dot products, AMX tiles)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: aarch64's vector and dot-product sets, shown as x86's are
ARM_SHOWN_FLAGS = ("sve", "sve2", "i8mm", "bf16")


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
    """Every instruction-set flag the kernel reports (x86's ``flags``, aarch64's ``Features``)."""
    return frozenset((_first("flags") or _first("Features")).split())


#: the /proc/cpuinfo fields that name a CPU's make and generation (x86, then aarch64)
ID_FIELDS = (
    "vendor_id",
    "cpu family",
    "model\t",
    "CPU implementer",
    "CPU architecture",
    "CPU variant",
    "CPU part",
)


def cpu_key() -> str:
    """What cached builds and measurements of this CPU are keyed by: `describe_cpu`'s line for a reader,
    then a digest of the model name, the make and generation fields and every flag, so that two CPUs
    with one name and different instruction sets never share a cache entry."""
    ids = [f"{field.strip()}={_first(field)}" for field in ID_FIELDS]
    whole = "\n".join([cpu_model_name(), *ids, " ".join(sorted(cpu_flags()))])
    return f"{describe_cpu()} [features {hashlib.sha256(whole.encode()).hexdigest()[:16]}]"


def native_bf16_flags() -> list[str]:
    """The native-bfloat16 flags this CPU has (empty: bf16 matmuls are emulated, often far slower)."""
    flags = cpu_flags()
    return [f for f in BF16_FLAGS if f in flags]


def describe_cpu() -> str:
    """One line for reports: the model name and the instruction sets that decide speed here."""
    flags = cpu_flags()
    shown = [f for f in ("avx2", "avx512f", "avx512_vnni", *BF16_FLAGS, *ARM_SHOWN_FLAGS) if f in flags]
    return f"{cpu_model_name() or _arm_name() or 'unknown CPU'} ({', '.join(shown) or 'no AVX2'})"


def _arm_name() -> str:
    """aarch64's /proc/cpuinfo has no model name: its implementer and part codes name the core."""
    implementer, part = _first("CPU implementer"), _first("CPU part")
    return f"CPU implementer {implementer} part {part}" if implementer else ""


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
