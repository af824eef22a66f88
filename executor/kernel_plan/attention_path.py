"""Which attention kernel runs decode rows (one query per request) and verify rows (``1 + k``), for one
request and for a batch, over a short and a long context (`model/attention_paths.AttentionPaths`),
chosen by timing the candidates on this machine at the model's head shapes and kept in the measurement
store.

On CPU the candidates are SDPA, float32-accumulating matmuls (both over keys gathered from the pages)
and, where it builds, the C++ kernel that reads the pages in place (`layers/paged_attention_cpu.py`).
The right answer differs by dtype and machine: SDPA's flash kernel is slow for one bf16 query (0.81 ms
vs 0.20 ms as float32 matmuls over 1.3k keys on an AVX512-BF16 EPYC; the C++ kernel 0.08 ms), while in
float32 SDPA and the matmuls are within noise. Prefill chunks always take SDPA (its causal kernel when
nothing is cached)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..layers.attention_kernels import MATMUL, PAGED_CPU, PAGED_TRITON, SDPA, attend
from ..layers.cpu_kernels import cpu_kernels
from ..layers.paged_attention_cpu import attend_paged_cpu
from ..layers.triton_kernels import TRITON_DTYPES, triton_available
from ..model.attention_paths import CASES, CONTEXTS, AttentionPaths
from .measurement.store import cached_measurement, interleaved_medians, machine_key
from .static_defaults import case_name, static_default

#: 4: the C++ kernel joins the candidates; 5: it splits long contexts; 6: the candidates take turns
MEASUREMENT_VERSION = 6


def _names(context: int) -> tuple[str, ...]:
    return tuple(f"{name}@{context}" for name, _, _ in CASES)


def choose_attention_paths(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    cache_dir: Path | None,
) -> AttentionPaths:
    """The faster kernel for each case here (cached per CPU, torch, threads, dtype and head shape).
    CUDA takes the Triton kernel over the pages for every decode and verify case where it runs, SDPA
    elsewhere (for one SmolLM2 query on an H100: 5.0 us a layer against 12.8 for gather + SDPA,
    `bench/reports/2026-11-27-gpu-own-decoder`)."""
    if device.type != "cpu":
        return AttentionPaths.all(PAGED_TRITON if dtype in TRITON_DTYPES and triton_available() else SDPA)
    key = (
        f"v{MEASUREMENT_VERSION}|{machine_key()}"
        f"|{dtype}|heads={num_heads}/{num_kv_heads}x{head_dim}|cpp={cpu_kernels() is not None}"
    )
    data = cached_measurement(
        cache_dir,
        "attention-paths",
        key,
        lambda: measure_attention_paths(num_heads, num_kv_heads, head_dim, dtype),
        "attention: timing SDPA, float32-accumulating matmuls and the C++ kernel for decode and verify rows",
        _names(CONTEXTS[0]) + _names(CONTEXTS[1]),
        default=static_default("attention-paths", case_name(dtype=dtype, cpp=cpu_kernels() is not None)),
    )
    short, long = (tuple(data.get(name) for name in _names(c)) for c in CONTEXTS)
    known = (SDPA, MATMUL, PAGED_CPU) if cpu_kernels() is not None else (SDPA, MATMUL)
    if not all(p in known for p in short + long):  # a damaged cache file: the unmeasured default
        return AttentionPaths()
    return AttentionPaths(short, long)


def measure_attention_paths(
    num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, repeats: int = 7
) -> dict:
    """{'<case>@<context>': the fastest kernel, and '<case>@<context>_seconds': each kernel's median,
    the kernels taking turns so that a busy moment falls on each alike. The torch kernels are timed on
    keys already gathered (the gather is not counted against them)."""
    result: dict = {}
    for context in CONTEXTS:
        for name, batch, q_len in CASES:
            q, k, v, mask = _inputs(batch, q_len, context, num_heads, num_kv_heads, head_dim, dtype)
            works = {
                path: lambda args=(q, k, v, mask, head_dim**-0.5, None, path): attend(*args)
                for path in (SDPA, MATMUL)
            }
            if cpu_kernels() is not None:
                pages = _paged_inputs(q, k, v, context)
                works[PAGED_CPU] = lambda pages=pages: attend_paged_cpu(*pages)
            for work in works.values():
                work()  # warm-up
            seconds = interleaved_medians(works, repeats)
            result[f"{name}@{context}"] = min(seconds, key=seconds.__getitem__)
            result[f"{name}@{context}_seconds"] = seconds
    return result


def _paged_inputs(q, k, v, context, block_size: int = 16) -> tuple:
    """`attend_paged_cpu`'s arguments for the same case: the keys and values laid out as pages."""
    batch, kv_heads, _, head_dim = k.shape
    num_blocks = batch * (-(-context // block_size))
    pool = q.new_zeros(2, (num_blocks + 1) * block_size, kv_heads, head_dim)  # one page past: padding
    tables = torch.arange(num_blocks).view(batch, -1)  # [batch, blocks per request]
    slots = (tables[:, :, None] * block_size + torch.arange(block_size)).reshape(batch, -1)[:, :context]
    pool[0, slots] = k.transpose(1, 2)
    pool[1, slots] = v.transpose(1, 2)
    q_len = q.shape[2]
    positions = (context - q_len + torch.arange(q_len)).expand(batch, q_len)  # [batch, q_len]
    lens = torch.full((batch,), context)
    return q.transpose(1, 2), pool, tables, positions, lens, block_size, head_dim**-0.5, None, None


def _inputs(batch, q_len, context, heads, kv_heads, head_dim, dtype):
    q = torch.randn(batch, heads, q_len, head_dim).to(dtype)  # [batch, heads, q_len, head_dim]
    # keys as the paged gather leaves them: [batch, max_kv, kv_heads, head_dim] seen as [.., kv_heads, max_kv, ..]
    k = torch.randn(batch, context, kv_heads, head_dim).to(dtype).transpose(1, 2)
    v = torch.randn(batch, context, kv_heads, head_dim).to(dtype).transpose(1, 2)
    mask = None
    if q_len > 1 or batch > 1:  # verify rows' causal mask over the cached keys; a batch's key padding
        pos = torch.arange(context)
        mask = (pos[None, :] <= (context - q_len + torch.arange(q_len))[:, None]).expand(
            batch, 1, q_len, context
        )
    return q, k, v, mask
