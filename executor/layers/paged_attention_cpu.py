"""The C++ CPU kernel for short queries (decode and verify rows) attending straight over the paged KV
pool (`paged_attention_cpu.cpp`): no page gather, no float32 copy of bfloat16 keys, one task per
(request, KV head) on torch's threads.

It is compiled on first use with torch's cpp_extension (``-O3 -march=native``, OpenMP; ninja and a
C++ compiler) into specexec's cache folder, one build per source, CPU and torch, and loaded from there
afterwards as the torch op ``torch.ops.specexec_cpu.paged_attention_short`` (the source includes ATen
and torch/library.h only, not torch/extension.h: about 11 s to build on 2 cores instead of 38). The
first build says so on the loading log. Where it cannot be built, or with ``SPECEXEC_CPU_KERNELS=0``,
attention runs on torch ops and the log says so once.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .cpu_info import describe_cpu
from .measurement_cache import default_cache_dir

logger = logging.getLogger("specexec")

SOURCE = Path(__file__).with_suffix(".cpp")
SWITCH = "SPECEXEC_CPU_KERNELS"  #: "0" keeps every CPU op on torch
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno")  #: (no errno: libm calls vectorize)


@functools.cache
def load_kernel() -> Callable | None:
    """The compiled ``paged_attention_short`` op, or None where it cannot be had (the reason is logged)."""
    if os.environ.get(SWITCH) == "0":
        logger.info("C++ CPU kernels off (%s=0): attention runs on torch ops", SWITCH)
        return None
    digest = hashlib.sha256(
        "\0".join([SOURCE.read_text(), describe_cpu(), torch.__version__, *CFLAGS]).encode()
    ).hexdigest()[:12]
    name = f"specexec_paged_attention_{digest}"
    build = default_cache_dir() / "cpu-kernels" / name
    started = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load

        build.mkdir(parents=True, exist_ok=True)
        if not any(build.glob("*.so")):
            logging.getLogger("specexec.loading").info(
                "building specexec's C++ CPU kernel once for this CPU (about 10-20 s); cached in %s", build
            )
        load(
            name=name,
            sources=[str(SOURCE)],
            extra_cflags=list(CFLAGS),
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            verbose=False,
            is_python_module=False,
        )
    except Exception as exc:  # no compiler, no ninja, a failed build: torch ops instead
        logger.warning(
            "the C++ CPU attention kernel could not be built (%s: %s); attention runs on torch ops",
            type(exc).__name__,
            str(exc).strip().splitlines()[-1] if str(exc).strip() else "",
        )
        return None
    logger.info("C++ CPU attention kernel loaded from %s (%.1f s)", build, time.perf_counter() - started)
    return torch.ops.specexec_cpu.paged_attention_short


def attend_paged_cpu(
    query: torch.Tensor,  # [group, max_q, heads, head_dim]
    kv: torch.Tensor,  # [2, slots, kv_heads, head_dim] one layer's pool
    block_tables: torch.Tensor,  # [group, max_blocks]
    query_pos: torch.Tensor,  # [group, max_q]
    kv_lens: torch.Tensor,  # [group]
    block_size: int,
    scaling: float,
    sliding_window: int | None,
    softcap: float | None,
) -> torch.Tensor:  # [group, max_q, heads, head_dim]
    """Each query over the keys its request holds at or before its position (and inside the sliding
    window), read from the pool in place; the kernel must have loaded (`load_kernel`)."""
    kernel = load_kernel()
    if kernel is None:
        raise RuntimeError("the C++ CPU attention kernel is not available")
    return kernel(
        query, kv, block_tables, query_pos, kv_lens, block_size, scaling, sliding_window or 0, softcap or 0.0
    )
