"""specexec's C++ CPU ops, built once per CPU and loaded as torch ops (``torch.ops.specexec_cpu``):

- ``paged_attention_short`` (`paged_attention_cpu.cpp`): decode and verify rows attending straight over
  the paged KV pool;
- ``add_rms_norm``, ``rotary_kv_write``, ``act_mul`` (`fused_ops_cpu.cpp`): the own decoder's residual
  add with its RMSNorm, RoPE with the K/V cache write, and act(gate) * up, one pass each;
- ``q4_linear``, ``q8_linear`` (`quantized/quantized_dot_cpu.cpp`): quantized linear layers on integer dot products
  over int8-quantized activations (``quantized_kernel: int8_dot``, `quantized/quantized_dot.py`), and
  ``q8_dequantize`` (`quantized/q8_dequantize_cpu.cpp`): their int8 tiles as dense weights for prefill;
- ``prenorm_layer``, ``prenorm_stack`` (`prenorm_layer_cpu.cpp`): a whole pre-norm decoder layer, or
  every layer of the decoder, as one op, calling the ones above (`model/decoder/fused_layer.py`);
- ``row_status_argmax`` (`row_summary_cpu.cpp`): each logit row's status and argmax for verification
  (`row_summary.py`).

They are compiled when the package is installed (`setup.py`), one library per ISA level
(`kernel_build/isa_variants.py`: AVX2, AVX-512 with VNNI, with VNNI and BF16), and the run loads the
richest one this CPU reports the instructions of, whose name holds the digest of these sources and
torch's version (`installed_library`): no run compiles anything. Where none fits (no compiler at
install, a source edited since, another torch, ``SPECEXEC_CPU_MARCH`` set to a target no library was
built for, a CPU below x86-64-v3) they are compiled on first use instead, saying so, with torch's
cpp_extension (``-O3 -march=native``, OpenMP; ninja and a C++ compiler) into specexec's cache folder
and loaded from there afterwards (the sources include ATen
and torch/library.h only, not torch/extension.h). A build is keyed by what decides its machine code:
the compiler's expansion of ``-march=native`` and its version (`compiler_target.py`), this CPU's
features (`cpu_info.cpu_key`), torch's version, the sources and the flags; the key is recorded beside
the ``.so`` (`RECORD`) and checked before loading, so a cache copied from another CPU (a shared home,
a CI cache, a container image) is built again, never loaded to die on an instruction this CPU lacks.
The first build says so, with how long it takes, on the loading log or else on standard error. A build
folder that another user could write (it or a folder above it writable by group or others, or owned by
another user: `cache_folder.others_could_write`) is never loaded from, since its ``.so`` would run their
code: the kernels are built for this process in a private temporary folder instead, with a warning
that names the folder and the ``chmod`` that makes it trusted again. Where
they cannot be built, or with ``SPECEXEC_CPU_KERNELS=0``, every caller runs its torch ops instead and
the log says so once; ``SPECEXEC_CPU_KERNELS=1`` makes a failed build an error instead.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.machinery
import json
import logging
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

import torch

from .cpu_info import cpu_flags, cpu_key
from .kernel_build import isa_variants
from .kernel_build.build_lock import held_build_lock
from .kernel_build.compiler_target import compiler_command, compiler_target
from .measurement.cache_folder import default_cache_dir, make_private_folders, others_could_write

logger = logging.getLogger("specexec")

SOURCES = tuple(Path(__file__).parent / name for name in isa_variants.SOURCES)
HEADERS = tuple(Path(__file__).parent / name for name in isa_variants.HEADERS)  #: part of a build's identity
#: "0" keeps every CPU op on torch; "1" makes a failed build an error; unset: built where it can be
SWITCH = "SPECEXEC_CPU_KERNELS"
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno")  #: (no errno: libm calls vectorize)
#: a target for ``-march`` instead of native (e.g. x86-64-v3: an estimate of an AVX2-only CPU on a richer
#: one, as docs/benchmarking.md describes); a target this CPU cannot run dies on its first instruction
MARCH = "SPECEXEC_CPU_MARCH"
#: the dtypes the fused ops take (float64, the tests' reference dtype, stays on torch ops)
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
RECORD = "build-key.json"  #: beside the .so: the identity it was built for
LOCK = "specexec.lock"  #: specexec's lock on a build folder (`build_lock.py`); torch's own is "lock"
#: what the first build takes: about 35 s on 2 cores here, longer on one core or a busy machine
FIRST_BUILD_TIME = "30 s to 2 minutes"


@functools.cache
def cpu_kernels():
    """``torch.ops.specexec_cpu`` once the ops are built and loaded; None where they cannot be (logged)."""
    switch = os.environ.get(SWITCH, "")
    if switch not in ("", "0", "1"):
        raise ValueError(
            f"{SWITCH} must be 0 (torch ops), 1 (C++ kernels or an error) or unset, got {switch!r}"
        )
    if switch == "0":
        logger.info("C++ CPU kernels off (%s=0): torch ops run instead", SWITCH)
        return None
    installed = installed_library()
    if installed is not None:
        try:
            torch.ops.load_library(str(installed))
            logger.info("C++ CPU kernels: %s (built at install)", installed.name)
            return torch.ops.specexec_cpu
        except (OSError, RuntimeError) as exc:
            logger.warning(
                "the installed C++ CPU kernels %s did not load (%s): building them now", installed, exc
            )
    identity = build_identity()
    started = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load

        build = usable_build_folder(identity)
        with held_build_lock(build / LOCK):
            _drop_stale_lock(build / "lock")
            _match_record_inplace(build, identity)
            if not any(build.glob("*.so")):
                _announce_first_build(build)
            load(
                name=build.name,
                sources=[str(s) for s in SOURCES],
                extra_cflags=list(cflags()),
                extra_ldflags=["-fopenmp"],
                build_directory=str(build),
                verbose=False,
                is_python_module=False,
            )
            for library in build.glob("*.so"):  # ours, in a folder of ours: closed as the next start wants
                library.chmod(stat.S_IMODE(library.stat().st_mode) & ~0o022)
    except Exception as exc:  # no compiler, no ninja, a failed build: torch ops instead
        last_line = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
        if switch == "1":
            raise RuntimeError(f"specexec's C++ CPU kernels could not be built ({SWITCH}=1): {exc}") from exc
        logger.warning(
            "specexec's C++ CPU kernels could not be built (%s: %s); torch ops run instead "
            "(they need a C++ compiler with OpenMP; %s=1 makes this an error)",
            type(exc).__name__,
            last_line,
            SWITCH,
        )
        return None
    logger.info("C++ CPU kernels loaded from %s (%.1f s)", build, time.perf_counter() - started)
    return torch.ops.specexec_cpu


def installed_variant() -> isa_variants.IsaVariant | None:
    """The ISA level this CPU runs the kernels at (``SPECEXEC_CPU_MARCH`` x86-64-v3: AVX2's), or None
    where no installed level stands for what is asked (another ``-march``, a CPU below x86-64-v3)."""
    march = os.environ.get(MARCH, "").strip()
    if march:
        name = isa_variants.MARCH_VARIANTS.get(march)
        return next((v for v in isa_variants.VARIANTS if v.name == name), None)
    return isa_variants.variant_for(cpu_flags())


def installed_library(folder: Path = Path(__file__).parent) -> Path | None:
    """The library `setup.py` built into ``folder`` for this CPU's level from these very sources and
    this torch, or None (then the kernels are built at first use)."""
    variant = installed_variant()
    if variant is None:
        return None
    module = variant.module(_sources_digest(), torch.__version__)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = folder / f"{module}{suffix}"
        if path.is_file():
            return path
    return None


def cflags() -> tuple[str, ...]:
    """`CFLAGS`, with ``-march=$SPECEXEC_CPU_MARCH`` in place of native where that is set."""
    march = os.environ.get(MARCH, "").strip()
    if not march:
        return CFLAGS
    if not all(c.isalnum() or c in "-_." for c in march):
        raise ValueError(f"{MARCH} must name a -march target (e.g. x86-64-v3), got {march!r}")
    return tuple(f"-march={march}" if flag == "-march=native" else flag for flag in CFLAGS)


def build_identity() -> dict[str, str]:
    """Everything a build's machine code depends on, as recorded beside it."""
    target = compiler_target(compiler_command(), cflags())
    return {
        "compiler": target.compiler,
        "compiler_version": target.version,
        "target": " ".join(target.options),
        "cpu": cpu_key(),
        "torch": torch.__version__,
        "cflags": " ".join(cflags()),
        "sources": _sources_digest(),
    }


def build_folder(identity: dict[str, str]) -> Path:
    """The folder one identity's build lives in (under the cache folder's ``cpu-kernels``)."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return default_cache_dir() / "cpu-kernels" / f"specexec_cpu_{digest}"


def usable_build_folder(identity: dict[str, str]) -> Path:
    """The folder to build and load ``identity``'s kernels in: `build_folder` (created ``0o700``) where no
    other user could have written it or a library in it, else a private folder of this process (with a
    warning naming the folder and what to do); RuntimeError where even that is not private."""
    folder = _usable_build_folder(json.dumps(identity, sort_keys=True), str(default_cache_dir()))
    make_private_folders(folder)  # (again: removed since the first call, it is made again, private)
    return folder


@functools.cache  # (one private folder a process, whoever asks: the build and `describe_cpu_kernels`)
def _usable_build_folder(identity_json: str, cache_dir: str) -> Path:
    build = build_folder(json.loads(identity_json))
    make_private_folders(build)
    libraries = sorted(build.glob("*.so"))
    problem = next(filter(None, map(others_could_write, [build, *libraries])), None)
    if problem is None:
        return build
    private = Path(tempfile.mkdtemp(prefix="specexec-cpu-kernels-")) / build.name
    private.mkdir(mode=0o700)
    atexit.register(shutil.rmtree, private.parent, ignore_errors=True)
    if (still := others_could_write(private)) is not None:
        raise RuntimeError(f"no private folder to build them in: {problem}, and {still}")
    logger.warning(
        "not loading specexec's C++ CPU kernels from %s: %s, so another user could have put code there "
        "that would run as you; building them for this process in %s instead (%s). Make the folder "
        "yours alone (chmod go-w, or chown it to you) or set SPECEXEC_CACHE_DIR to a folder of yours",
        build,
        problem,
        private,
        FIRST_BUILD_TIME,
    )
    return private


def kernels_key() -> str:
    """Which kernels run the CPU's ops, for the keys of measurements that time them (beside the CPU and
    torch, which those keys name already): the sources' and flags' digest, or "torch ops" where they
    are switched off. Nothing is built or loaded to say so."""
    if os.environ.get(SWITCH) == "0":
        return "torch ops"
    if (installed := installed_library()) is not None:
        return installed.name.split(".")[0]  # (its name holds the sources' digest and the flags')
    return hashlib.sha256("\0".join([_sources_digest(), *cflags()]).encode()).hexdigest()[:12]


@functools.cache
def _sources_digest() -> str:
    """The sources' and headers' sha256, as a build records it (read once a process)."""
    return isa_variants.sources_digest(Path(__file__).parent)


def describe_cpu_kernels() -> str:
    """Which kernels run on the CPU, for `specexec run`'s header: the C++ ones and what they were built
    for, or torch's and why."""
    if cpu_kernels() is not None and (installed := installed_library()) is not None:
        variant = installed_variant()
        return f"C++ (built at install for {variant.name}: {' '.join(variant.march_flags)}; {installed})"
    if cpu_kernels() is not None:
        target = compiler_target(compiler_command(), cflags())
        built_for = (
            f"-march={target.cpu}" if target.cpu else next(f for f in cflags() if f.startswith("-march"))
        )
        folder = usable_build_folder(build_identity())
        return f"C++ ({built_for}, {target.version or target.compiler}; {folder})"
    if os.environ.get(SWITCH) == "0":
        return f"torch ({SWITCH}=0)"
    return "torch (the C++ build failed: see the warning above; it needs a C++ compiler with OpenMP)"


def _match_record_inplace(build: Path, identity: dict[str, str]) -> None:
    """A build is loaded only under the identity it records: a folder that records another one (or
    none: an older specexec's, a copied one) loses its build products, is built again, and records
    this identity first (a build stopped midway then leaves a record and no ``.so``: built again too)."""
    record = build / RECORD
    try:
        recorded = json.loads(record.read_text())
    except (OSError, ValueError):
        recorded = None
    if recorded == identity:
        return
    stale = [p for p in build.iterdir() if p.name != RECORD and not p.name.startswith(LOCK)]
    if stale:
        logger.warning(
            "the CPU kernels in %s do not record this CPU and compiler: building them again", build
        )
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    record.write_text(json.dumps(identity, indent=1))


def _drop_stale_lock(lock: Path) -> None:
    """torch's own build lock, found while specexec's is held: every builder of this folder holds
    specexec's lock around torch's, so this one was left by a builder that died (torch would wait on
    it forever)."""
    if lock.exists():
        logger.warning("removing torch's build lock, left by a build that was stopped: %s", lock)
        lock.unlink(missing_ok=True)


def _announce_first_build(build: Path) -> None:
    """The first build's pause, said where the user will see it: on the loading log where something
    shows it (`specexec run`, a configured logger), else as a line on standard error (a plain
    ``Executor()`` in a script has no logging set up)."""
    message = (
        f"building specexec's C++ CPU kernels once for this CPU and compiler ({FIRST_BUILD_TIME}); "
        f"cached in {build}"
    )
    loading = logging.getLogger("specexec.loading")
    if loading.isEnabledFor(logging.INFO) and loading.hasHandlers():
        loading.info(message)
    else:
        print(f"specexec: {message}", file=sys.stderr, flush=True)


def fused_ops_take(x: torch.Tensor) -> bool:
    """Whether the fused ops run for this tensor: on the CPU, in a dtype they take, once built."""
    return x.device.type == "cpu" and x.dtype in FUSED_DTYPES and cpu_kernels() is not None
