"""specexec's C++ CPU ops, built once per CPU and loaded as torch ops (``torch.ops.specexec_cpu``):

- ``paged_attention_short`` (`paged_attention_cpu.cpp`): decode and verify rows attending straight over
  the paged KV pool;
- ``add_rms_norm``, ``rotary_kv_write``, ``act_mul`` (`fused_ops_cpu.cpp`): the own decoder's residual
  add with its RMSNorm, RoPE with the K/V cache write, and act(gate) * up, one pass each;
- ``q4_linear``, ``q8_linear`` (`quantized/quantized_dot_cpu.cpp`): quantized linear layers on integer dot products
  over int8-quantized activations (``quantized_kernel: int8_dot``, `quantized/quantized_dot.py`);
- ``prenorm_layer``, ``prenorm_stack`` (`prenorm_layer_cpu.cpp`): a whole pre-norm decoder layer, or
  every layer of the decoder, as one op, calling the ones above (`model/decoder/fused_layer.py`);
- ``row_status_argmax`` (`row_summary_cpu.cpp`): each logit row's status and argmax for verification
  (`row_summary.py`).

They are compiled on first use with torch's cpp_extension (``-O3 -march=native``, OpenMP; ninja and a
C++ compiler) into specexec's cache folder, one build per source, CPU and torch, and loaded from there
afterwards (the sources include ATen and torch/library.h only, not torch/extension.h: the build takes
seconds, not a minute). The first build says so on the loading log. Where they cannot be built, or with
``SPECEXEC_CPU_KERNELS=0``, every caller runs its torch ops instead and the log says so once.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from pathlib import Path

import torch

from .cpu_info import describe_cpu
from .measurement_cache import default_cache_dir

logger = logging.getLogger("specexec")

SOURCES = tuple(
    Path(__file__).parent / name
    for name in (
        "paged_attention_cpu.cpp",
        "fused_ops_cpu.cpp",
        "quantized/quantized_dot_cpu.cpp",
        "prenorm_layer_cpu.cpp",
        "row_summary_cpu.cpp",
    )
)
#: included by the sources: part of a build's identity
HEADERS = tuple(
    Path(__file__).parent / name
    for name in ("float_convert.h", "attention_vectors.h", "attention_bf16_dot.h")
)
STALE_LOCK_S = 600.0  #: a build lock older than this was left by a process that died building
SWITCH = "SPECEXEC_CPU_KERNELS"  #: "0" keeps every CPU op on torch
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno")  #: (no errno: libm calls vectorize)
#: the dtypes the fused ops take (float64, the tests' reference dtype, stays on torch ops)
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def cpu_kernels():
    """``torch.ops.specexec_cpu`` once the ops are built and loaded; None where they cannot be (logged)."""
    if os.environ.get(SWITCH) == "0":
        logger.info("C++ CPU kernels off (%s=0): torch ops run instead", SWITCH)
        return None
    digest = hashlib.sha256(
        "\0".join(
            [*(s.read_text() for s in SOURCES + HEADERS), describe_cpu(), torch.__version__, *CFLAGS]
        ).encode()
    ).hexdigest()[:12]
    name = f"specexec_cpu_{digest}"
    build = default_cache_dir() / "cpu-kernels" / name
    started = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load

        build.mkdir(parents=True, exist_ok=True)
        _drop_stale_lock(build / "lock")
        if not any(build.glob("*.so")):
            logging.getLogger("specexec.loading").info(
                "building specexec's C++ CPU kernels once for this CPU (about 20 s); cached in %s", build
            )
        load(
            name=name,
            sources=[str(s) for s in SOURCES],
            extra_cflags=list(CFLAGS),
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            verbose=False,
            is_python_module=False,
        )
    except Exception as exc:  # no compiler, no ninja, a failed build: torch ops instead
        logger.warning(
            "specexec's C++ CPU kernels could not be built (%s: %s); torch ops run instead",
            type(exc).__name__,
            str(exc).strip().splitlines()[-1] if str(exc).strip() else "",
        )
        return None
    logger.info("C++ CPU kernels loaded from %s (%.1f s)", build, time.perf_counter() - started)
    return torch.ops.specexec_cpu


def _drop_stale_lock(lock: Path) -> None:
    """torch's build lock, left by a process killed while it built (Ctrl-C, a stopped worker), makes
    every later build wait for it forever; a build takes well under `STALE_LOCK_S`."""
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_S:
        logger.warning("removing a stale build lock (%.0f s old): %s", age, lock)
        lock.unlink(missing_ok=True)


def fused_ops_take(x: torch.Tensor) -> bool:
    """Whether the fused ops run for this tensor: on the CPU, in a dtype they take, once built."""
    return x.device.type == "cpu" and x.dtype in FUSED_DTYPES and cpu_kernels() is not None
