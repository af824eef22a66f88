"""The own decoder's Triton kernels for CUDA (`executor/layers/triton_kernels/`), checked where no GPU is:

- compiled for an H100 (sm_90) by Triton's own compiler and the ptxas it ships, so a kernel that only
  the GPU compiler would refuse fails here;
- run by Triton's interpreter on CPU tensors against the torch ops they stand in for
  (`triton_interpreter_checks.py`, in a child process: the interpreter must be on before the kernels are
  decorated, and this process keeps its compiled ones).

On a GPU, `test_cuda_executor.py` runs them compiled inside the own decoder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton  # (xgrammar requires it on Linux x86-64: every install of specexec there has it)
from specexec.executor.layers.triton_kernels import fused_ops, paged_attention, row_summary, skinny_gemm

HERE = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run(
        [sys.executable, str(HERE / "triton_interpreter_checks.py")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_every_kernel_matches_its_torch_ops_in_the_interpreter(interpreter_results):
    assert len(interpreter_results) >= 80
    failed = {case: why for case, why in interpreter_results.items() if why is not None}
    assert not failed, failed


def _compile(kernel, types: dict[str, str], constexprs: dict, num_warps: int = 4) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    signature = {n: types.get(n, "constexpr") for n in names}
    source = ASTSource(
        fn=kernel, signature=signature, constexprs={(names.index(k),): v for k, v in constexprs.items()}
    )
    triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "enable_fp_fusion": True}
    )


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_kernels_compile_for_an_h100(dtype):
    ints = [
        "num_queries",
        "num_heads",
        "rep",
        "num_splits",
        "tiles_per_split",
        "block_size",
        "window",
        "q_stride_g",
        "q_stride_t",
        "q_stride_h",
        "kv_stride_side",
        "kv_stride_slot",
        "kv_stride_head",
        "tables_stride",
        "pos_stride_g",
        "pos_stride_t",
    ]
    norm = {n: f"*{dtype}" for n in ("x_ptr", "res_ptr", "w_ptr", "out_ptr", "total_ptr")}
    norm.update(dim="i32", eps="fp32", offset="fp32")
    for has_residual in (True, False):
        _compile(fused_ops._add_rms_norm_kernel, norm, dict(HAS_RESIDUAL=has_residual, BLOCK=1024))
    rotary = {n: f"*{dtype}" for n in ("qkv_ptr", "rows_ptr", "kv_ptr", "q_ptr")}
    rotary.update(slots_ptr="*i64", qkv_stride="i32", kv_stride_side="i64", kv_stride_slot="i32")
    _compile(
        fused_ops._rotary_kv_write_kernel, rotary, dict(NUM_HEADS=9, NUM_KV_HEADS=3, HEAD_DIM=64, BLOCK=64)
    )
    for act in (fused_ops.SILU, fused_ops.GELU_TANH):
        types = dict(gate_up_ptr=f"*{dtype}", out_ptr=f"*{dtype}", width="i32")
        _compile(fused_ops._act_mul_kernel, types, dict(ACT=act, BLOCK=1024))
    split = dict(q_ptr=f"*{dtype}", kv_ptr=f"*{dtype}", tables_ptr="*i32", pos_ptr="*i64", lens_ptr="*i32")
    split.update(max_ptr="*fp32", sum_ptr="*fp32", acc_ptr="*fp32", scale="fp32", softcap="fp32")
    split.update({n: "i32" for n in ints})
    for softcap in (False, True):
        constexprs = dict(HAS_SOFTCAP=softcap, HEAD_DIM=64, BLOCK_D=64, TILE=paged_attention.TILE)
        _compile(paged_attention._split_kernel, split, constexprs)
    merge = dict(max_ptr="*fp32", sum_ptr="*fp32", acc_ptr="*fp32", out_ptr=f"*{dtype}", num_splits="i32")
    _compile(paged_attention._merge_kernel, merge, dict(HEAD_DIM=64, BLOCK_D=64, BLOCK_SPLITS=8))
    summary = dict(x_ptr=f"*{dtype}", out_ptr="*i64", vocab="i32", stride="i32")
    _compile(
        row_summary._row_status_argmax_kernel,
        summary,
        dict(BLOCK=row_summary.BLOCK, NO_INDEX=row_summary.NO_INDEX),
    )


def test_the_skinny_gemm_compiles_for_an_h100_with_every_measured_config():
    ptrs = ("x_ptr", "res_ptr", "norm_w_ptr", "total_ptr", "w_ptr", "out_ptr")
    types = {n: "*bf16" for n in ptrs}
    ints = ("M", "N", "K", "stride_xm", "stride_wn", "stride_om", "stride_os", "K_PER_SPLIT")
    types.update({n: "i32" for n in ints})
    types.update(eps="fp32", offset="fp32")
    for config in skinny_gemm.MEASURED:
        for norm, residual in ((False, False), (True, False), (True, True)):
            if config.split_k > 1:
                types["out_ptr"] = "*fp32"
            constexprs = dict(
                BLOCK_M=skinny_gemm.MAX_ROWS, BLOCK_N=config.block_n,
                BLOCK_K=config.block_k, NUM_STAGES=config.num_stages, NORM=norm, HAS_RESIDUAL=residual,
                UPCAST=False,
            )  # fmt: skip
            _compile(skinny_gemm._skinny_gemm_kernel, types, constexprs, config.num_warps)
    sums = dict(
        part_ptr="*fp32", bias_ptr="*bf16", out_ptr="*bf16", N="i32", stride_pm="i32", stride_ps="i32"
    )
    sums.update(stride_om="i32")
    for has_bias in (False, True):
        _compile(skinny_gemm._sum_splits_kernel, sums, dict(SPLIT_K=4, HAS_BIAS=has_bias, BLOCK=1024))


def test_the_kernels_are_taken_only_on_cuda_in_the_dtypes_they_know(monkeypatch):
    from specexec.executor.layers import triton_kernels

    assert not triton_kernels.triton_ops_take(torch.zeros(2))  # a CPU tensor
    monkeypatch.setenv(triton_kernels.SWITCH, "0")
    triton_kernels.triton_available.cache_clear()
    try:
        assert not triton_kernels.triton_available()
    finally:
        monkeypatch.delenv(triton_kernels.SWITCH)
        triton_kernels.triton_available.cache_clear()
    assert triton_kernels.triton_available()
    assert torch.float64 not in triton_kernels.TRITON_DTYPES
