"""The Triton kernels of `executor/layers/triton_kernels/` against the torch ops they stand in for, run
on CPU tensors by Triton's interpreter. Run as a child process (``TRITON_INTERPRET=1`` must be set before
Triton decorates the kernels): prints one JSON object, case -> None (passed) or the mismatch.

    TRITON_INTERPRET=1 python tests/triton_interpreter_checks.py
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1 / 64, atol=1 / 64)}


def reference_attention(q, kv, tables, pos, lens, block_size, scale, window, softcap):
    """float64 attention of each query row over the keys it sees (the kernels' rule), zeros where none."""
    group, max_q, heads, _ = q.shape
    rep = heads // kv.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for g in range(group):
        for t in range(max_q):
            p = int(pos[g, t])
            lo = max(0, p - window + 1) if window else 0
            keys = range(lo, min(p, int(lens[g]) - 1) + 1)
            if not keys:
                continue
            slots = [int(tables[g, k // block_size]) * block_size + k % block_size for k in keys]
            for h in range(heads):
                k = kv[0, slots, h // rep].double()
                v = kv[1, slots, h // rep].double()
                s = (k @ q[g, t, h].double()) * scale
                if softcap:
                    s = softcap * torch.tanh(s / softcap)
                out[g, t, h] = torch.softmax(s, 0) @ v
    return out


def attention_cases():
    """(name, args): decode and verify rows, GQA, a sliding window, a soft cap, a context long enough
    for several tiles per split, a padding row past its request's keys."""
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for max_q, num_pages, window, softcap in (
            (1, 12, None, None),
            (4, 12, None, None),
            (4, 12, 5, None),
            (1, 12, None, 30.0),
            (1, 140, None, None),  # 2240 keys: 35 tiles over 32 splits, 2 tiles each
        ):
            if dtype != torch.float32 and (num_pages > 100 or window or softcap):
                continue  # (the interpreter is slow: bfloat16 for plain decode and verify rows only)
            block_size, kv_heads, heads, head_dim = 16, 2, 6, 32
            kv = torch.randn(2, 160 * block_size, kv_heads, head_dim, generator=gen).to(dtype)
            q = torch.randn(2, max_q, heads, head_dim, generator=gen).to(dtype)
            tables = torch.stack([torch.randperm(160, generator=gen)[:num_pages] for _ in range(2)])
            lens = torch.tensor([num_pages * block_size - 7, num_pages * block_size // 2 + 3])
            pos = (lens - max_q)[:, None] + torch.arange(max_q)[None]  # [2, max_q]: the last keys
            pos[1, -1] = 10**6  # padding: sees every key of its request
            name = f"attention-{str(dtype)[6:]}-q{max_q}-keys{num_pages * block_size}"
            name += f"-window{window}" if window else ""
            name += f"-softcap{softcap}" if softcap else ""
            yield name, dtype, (q, kv, tables, pos, lens, block_size, head_dim**-0.5, window, softcap)


def check(name, got, want, dtype, results):
    try:
        torch.testing.assert_close(got.double(), want.double(), **TOLERANCE[dtype])
        results[name] = None
    except AssertionError as exc:
        results[name] = str(exc).splitlines()[0:3]


def run_checks() -> dict:
    from specexec.executor.layers.rotary import apply_rotary
    from specexec.executor.layers.triton_kernels import fused_ops
    from specexec.executor.layers.triton_kernels.paged_attention import attend_paged_triton

    results: dict = {}
    for name, dtype, args in attention_cases():
        check(name, attend_paged_triton(*args), reference_attention(*args), dtype, results)
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        tag = str(dtype)[6:]
        x, residual = (torch.randn(5, 96, generator=gen).to(dtype) for _ in range(2))
        weight = torch.randn(96, generator=gen).to(dtype)
        for unit_offset in (False, True):
            out, total = fused_ops.add_rms_norm(x, residual, weight, 1e-6, unit_offset)
            want_total = residual + x
            scale = 1.0 + weight.float() if unit_offset else weight.float()
            want = F.rms_norm(want_total.float(), (96,), scale, 1e-6).to(dtype)
            check(f"add_rms_norm-{tag}-offset{unit_offset}-sum", total, want_total, dtype, results)
            check(f"add_rms_norm-{tag}-offset{unit_offset}", out, want, dtype, results)
        out, total = fused_ops.add_rms_norm(x, None, weight, 1e-6, False)
        check(f"rms_norm-{tag}", out, F.rms_norm(x.float(), (96,), weight.float(), 1e-6), dtype, results)
        results[f"rms_norm-{tag}-returns-its-input"] = None if total is x else "total is not x"
        gate_up = torch.randn(3, 2 * 80, generator=gen).to(dtype)
        gate, up = gate_up.chunk(2, dim=-1)
        check(f"act_mul-{tag}-silu", fused_ops.act_mul(gate_up, 0), F.silu(gate) * up, dtype, results)
        gelu = F.gelu(gate, approximate="tanh") * up
        check(f"act_mul-{tag}-gelu_tanh", fused_ops.act_mul(gate_up, 1), gelu, dtype, results)
        tokens, heads, kv_heads, head_dim = 5, 4, 2, 16
        qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
        rows = torch.randn(tokens, 2, 1, head_dim, generator=gen).to(dtype)
        pool = torch.zeros(2, 20, kv_heads, head_dim, dtype=dtype)
        slots = torch.tensor([3, 7, 0, 19, 11])
        q = fused_ops.rotary_kv_write(qkv, rows, pool, slots, heads, kv_heads, head_dim)
        rotated = apply_rotary(qkv[:, : (heads + kv_heads) * head_dim].view(tokens, -1, head_dim), rows)
        check(f"rotary_kv_write-{tag}-q", q, rotated[:, :heads], dtype, results)
        check(f"rotary_kv_write-{tag}-k", pool[0, slots], rotated[:, heads:], dtype, results)
        values = qkv[:, (heads + kv_heads) * head_dim :].view(tokens, kv_heads, head_dim)
        check(f"rotary_kv_write-{tag}-v", pool[1, slots], values, dtype, results)
        untouched = torch.ones(20, dtype=torch.bool)
        untouched[slots] = False
        results[f"rotary_kv_write-{tag}-other-slots"] = (
            None if not pool[:, untouched].any() else "wrote elsewhere"
        )
    skinny_checks(results)
    row_summary_checks(results)
    return results


def skinny_checks(results: dict) -> None:
    """The skinny GEMM (every config shape it can take: tails of N and K, splits, bias, 1-16 rows) against
    F.linear in float64 of the same inputs, and its fused norm against add_rms_norm then F.linear."""
    from specexec.executor.layers.triton_kernels import fused_ops
    from specexec.executor.layers.triton_kernels.skinny_gemm import SkinnyConfig, skinny_gemm

    gen = torch.Generator().manual_seed(2)
    cases = [  # rows, N, K, config, bias
        (1, 100, 300, SkinnyConfig(32, 64, 1), False),
        (3, 70, 520, SkinnyConfig(64, 128, 2), True),
        (16, 33, 64, SkinnyConfig(32, 64, 4), False),
        (5, 64, 1000, SkinnyConfig(32, 256, 4), True),
    ]
    for dtype in (torch.bfloat16, torch.float16):
        tag = str(dtype)[6:]
        for rows, n, k, config, has_bias in cases:
            x = torch.randn(rows, k, generator=gen).to(dtype)
            w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
            bias = torch.randn(n, generator=gen).to(dtype) if has_bias else None
            got, total = skinny_gemm(x, w, bias, config)
            want = F.linear(x.double(), w.double(), None if bias is None else bias.double())
            name = f"skinny-{tag}-{rows}x{n}x{k}-{config.describe()}"
            check(name, got, want, torch.bfloat16, results)
            results[f"{name}-total-is-x"] = None if total is x else "total is not x"
            for residual, unit_offset in (
                (None, False),
                (torch.randn(rows, k, generator=gen).to(dtype), True),
            ):
                norm_w = torch.randn(k, generator=gen).to(dtype)
                got, total = skinny_gemm(x, w, bias, config, (residual, norm_w, 1e-6, unit_offset))
                h, want_total = fused_ops.add_rms_norm(x, residual, norm_w, 1e-6, unit_offset)
                want = F.linear(h.double(), w.double(), None if bias is None else bias.double())
                fused = f"{name}-norm{'-residual' if residual is not None else ''}"
                check(fused, got, want, torch.bfloat16, results)
                results[f"{fused}-sum"] = None if torch.equal(total, want_total) else "x + residual differs"


def row_summary_checks(results: dict) -> None:
    """row_status_argmax against torch's max: ties (first index), NaN, +inf, all -inf, -0/0, a view."""
    from specexec.executor.layers.triton_kernels.row_summary import row_status_argmax
    from specexec.sampling.rejection import row_summary

    gen = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(9, 5000, generator=gen).to(dtype)
        x[1, 4321] = float("nan")
        x[2, 17] = float("inf")
        x[3] = float("-inf")
        x[4, 7] = x[4, 4999] = 50  # a tie in one lane's reach and beyond it
        x[5] = 0.0
        x[5, 3] = -0.0
        x[6, 2049] = x[6, 4097] = 100  # a tie across lanes
        x[7] = float("-inf")
        x[7, 4500] = -3
        x[8] = torch.round(x[8])  # many ties
        for view, tag in ((x, "rows"), (x[:, 1:4000], "view")):
            got, want = row_status_argmax(view), row_summary(view)
            readable = want[:, 0] == 0  # (an unreadable row's argmax is never read)
            ok = torch.equal(got[:, 0], want[:, 0]) and torch.equal(got[readable, 1], want[readable, 1])
            results[f"row_status_argmax-{str(dtype)[6:]}-{tag}"] = None if ok else f"{got} != {want}"


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("run with TRITON_INTERPRET=1")
    print(json.dumps(run_checks()))
