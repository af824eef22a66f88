"""Which attention kernel runs decode rows (one query per request) and verify rows (``1 + k``), chosen
by timing both on this machine at the model's head shapes and cached like the forward-cost curve.

On CPU the right answer differs by dtype and machine: SDPA's flash kernel is slow for one bf16 query
(0.81 ms vs 0.20 ms as float32 matmuls over 1.3k keys on an AVX512-BF16 EPYC), while in float32 the two
are within noise. Prefill chunks always take SDPA (its causal kernel when nothing is cached)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .attention_kernels import AUTO, MATMUL, SDPA, attend
from .cpu_info import describe_cpu
from .measurement_cache import cached_measurement

MEASUREMENT_VERSION = 1
CONTEXT = 1024  #: keys per request in the timed calls
BATCHES = (1, 8)  #: requests per timed call (both summed: batch 1 and a full verify batch)
VERIFY_QUERY_LEN = 4  #: 1 + 3 drafts


@dataclass(frozen=True, slots=True)
class AttentionPaths:
    decode: str = AUTO  #: kernel for groups of one query per request
    verify: str = AUTO  #: kernel for groups of 2..64 queries per request

    def for_group(self, max_query_len: int, is_short: bool) -> str:
        if not is_short:
            return SDPA
        return self.decode if max_query_len == 1 else self.verify


def choose_attention_paths(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    cache_dir: Path | None,
) -> AttentionPaths:
    """The faster kernel for decode and for verify rows here (cached per CPU, torch, threads, shapes).
    CUDA keeps SDPA (its flash kernels serve both)."""
    if device.type != "cpu":
        return AttentionPaths(SDPA, SDPA)
    key = (
        f"v{MEASUREMENT_VERSION}|{describe_cpu()}|torch {torch.__version__}|threads={torch.get_num_threads()}"
        f"|{dtype}|heads={num_heads}/{num_kv_heads}x{head_dim}"
    )
    data = cached_measurement(
        cache_dir,
        "attention-paths",
        key,
        lambda: measure_attention_paths(num_heads, num_kv_heads, head_dim, dtype),
        "attention: timing SDPA against float32 matmuls for decode and verify rows",
        ("decode", "verify"),
    )
    paths = [data.get("decode"), data.get("verify")]
    if not all(p in (SDPA, MATMUL) for p in paths):  # a damaged cache file: the unmeasured default
        return AttentionPaths()
    return AttentionPaths(*paths)


def measure_attention_paths(
    num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, repeats: int = 5
) -> dict:
    """{'decode': kernel, 'verify': kernel, and the seconds each took} for this shape and dtype."""
    result: dict = {}
    for name, q_len in (("decode", 1), ("verify", VERIFY_QUERY_LEN)):
        seconds = {}
        for path in (SDPA, MATMUL):
            total = 0.0
            for batch in BATCHES:
                q, k, v, mask = _inputs(batch, q_len, num_heads, num_kv_heads, head_dim, dtype)
                args = (q, k, v, mask, head_dim**-0.5, None, path)
                attend(*args)  # warm-up
                total += _median_seconds(lambda args=args: attend(*args), repeats)
            seconds[path] = total
        result[name] = min(seconds, key=seconds.__getitem__)
        result[f"{name}_seconds"] = seconds
    return result


def _inputs(batch, q_len, heads, kv_heads, head_dim, dtype):
    q = torch.randn(batch, heads, q_len, head_dim).to(dtype)  # [batch, heads, q_len, head_dim]
    # keys as the paged gather leaves them: [batch, max_kv, kv_heads, head_dim] seen as [.., kv_heads, max_kv, ..]
    k = torch.randn(batch, CONTEXT, kv_heads, head_dim).to(dtype).transpose(1, 2)
    v = torch.randn(batch, CONTEXT, kv_heads, head_dim).to(dtype).transpose(1, 2)
    mask = None
    if q_len > 1:  # the verify rows' causal mask over the cached keys
        pos = torch.arange(CONTEXT)
        mask = (pos[None, :] <= (CONTEXT - q_len + torch.arange(q_len))[:, None]).expand(
            batch, 1, q_len, CONTEXT
        )
    return q, k, v, mask


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]
