"""Which attention kernel runs decode rows (one query per request) and verify rows (``1 + k``), for one
request and for a batch, chosen by timing both on this machine at the model's head shapes and cached
like the forward-cost curve.

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

MEASUREMENT_VERSION = 2
CONTEXT = 1024  #: keys per request in the timed calls
VERIFY_QUERY_LEN = 4  #: 1 + 3 drafts
#: the timed shapes: (name, requests, queries per request)
CASES = (
    ("decode_single", 1, 1),
    ("decode_batched", 8, 1),
    ("verify_single", 1, VERIFY_QUERY_LEN),
    ("verify_batched", 8, VERIFY_QUERY_LEN),
)


@dataclass(frozen=True, slots=True)
class AttentionPaths:
    """The kernel for each kind of short-query group: one query per request (decode) or 2..64 (verify),
    one request or several."""

    decode_single: str = AUTO
    decode_batched: str = AUTO
    verify_single: str = AUTO
    verify_batched: str = AUTO

    @classmethod
    def all(cls, path: str) -> AttentionPaths:
        return cls(path, path, path, path)

    def for_group(self, max_query_len: int, is_short: bool, num_queries: int = 1) -> str:
        if not is_short:
            return SDPA
        if max_query_len == 1:
            return self.decode_single if num_queries == 1 else self.decode_batched
        return self.verify_single if num_queries == 1 else self.verify_batched


def choose_attention_paths(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    cache_dir: Path | None,
) -> AttentionPaths:
    """The faster kernel for each case here (cached per CPU, torch, threads, dtype and head shape).
    CUDA keeps SDPA (its flash kernels serve every case)."""
    if device.type != "cpu":
        return AttentionPaths.all(SDPA)
    key = (
        f"v{MEASUREMENT_VERSION}|{describe_cpu()}|torch {torch.__version__}|threads={torch.get_num_threads()}"
        f"|{dtype}|heads={num_heads}/{num_kv_heads}x{head_dim}"
    )
    names = tuple(name for name, _, _ in CASES)
    data = cached_measurement(
        cache_dir,
        "attention-paths",
        key,
        lambda: measure_attention_paths(num_heads, num_kv_heads, head_dim, dtype),
        "attention: timing SDPA against float32-accumulating matmuls for decode and verify rows",
        names,
    )
    paths = [data.get(name) for name in names]
    if not all(p in (SDPA, MATMUL) for p in paths):  # a damaged cache file: the unmeasured default
        return AttentionPaths()
    return AttentionPaths(*paths)


def measure_attention_paths(
    num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, repeats: int = 5
) -> dict:
    """{case: the faster kernel, and '<case>_seconds': each kernel's median time} for this shape."""
    result: dict = {}
    for name, batch, q_len in CASES:
        q, k, v, mask = _inputs(batch, q_len, num_heads, num_kv_heads, head_dim, dtype)
        seconds = {}
        for path in (SDPA, MATMUL):
            args = (q, k, v, mask, head_dim**-0.5, None, path)
            attend(*args)  # warm-up
            seconds[path] = _median_seconds(lambda args=args: attend(*args), repeats)
        result[name] = min(seconds, key=seconds.__getitem__)
        result[f"{name}_seconds"] = seconds
    return result


def _inputs(batch, q_len, heads, kv_heads, head_dim, dtype):
    q = torch.randn(batch, heads, q_len, head_dim).to(dtype)  # [batch, heads, q_len, head_dim]
    # keys as the paged gather leaves them: [batch, max_kv, kv_heads, head_dim] seen as [.., kv_heads, max_kv, ..]
    k = torch.randn(batch, CONTEXT, kv_heads, head_dim).to(dtype).transpose(1, 2)
    v = torch.randn(batch, CONTEXT, kv_heads, head_dim).to(dtype).transpose(1, 2)
    mask = None
    if q_len > 1 or batch > 1:  # verify rows' causal mask over the cached keys; a batch's key padding
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
