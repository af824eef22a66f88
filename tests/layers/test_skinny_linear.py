"""The own decoder's projections over few rows on CUDA (`executor/layers/skinny_linear.py`).

Without a GPU: which rows take which config, and that nothing changes on a CPU model. The kernels
themselves are checked by Triton's interpreter (`triton_interpreter_checks.py`). On a GPU (marked
``gpu``): the compiled kernel against F.linear, and an executor whose projections all run it (every
config forced) against the same executor on cuBLAS.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from specexec import Executor, ExecutorConfig, Request, SamplingParams
from specexec.executor.kernel_plan.skinny_gemm import choose_skinny_kernels
from specexec.executor.layers import skinny_linear
from specexec.executor.layers.skinny_linear import SkinnyLinear, project_normed
from tiny_models import make_prompts, make_tiny_model

gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_each_row_count_takes_the_config_of_its_bucket():
    layer = SkinnyLinear(torch.nn.Linear(8, 4))
    layer.configs = {1: "one", 8: "eight"}
    assert [layer.config_for(r) for r in (1, 2, 4, 5, 8, 9, 16, 17, 512)] == [
        "one", None, None, "eight", "eight", None, None, None, None,
    ]  # fmt: skip
    x = torch.randn(3, 8)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))  # no config: cuBLAS's path


def test_a_cpu_model_is_left_as_it_is():
    _, model = make_tiny_model("llama", dtype=torch.bfloat16)
    with Executor(model, ExecutorConfig(device="cpu", dtype="bfloat16", num_kv_blocks=64)) as executor:
        choice = executor.setup.kernel_plan.skinny_kernels
        assert choice.kernel == "off" and "cpu" in choice.reason
        layers = executor.core.runner.model.model.layers
        assert not any(isinstance(m, SkinnyLinear) for layer in layers for m in layer.modules())


def test_project_normed_without_a_skinny_layer_is_the_norm_then_the_projection():
    from specexec.executor.layers.norm import RMSNorm

    norm, proj = RMSNorm(torch.randn(8), 1e-6), torch.nn.Linear(8, 4)
    x, residual = torch.randn(3, 8), torch.randn(3, 8)
    out, total = project_normed(norm, proj, x, residual)
    h, want_total = norm.add_forward(x, residual)
    torch.testing.assert_close(out, proj(h))
    torch.testing.assert_close(total, want_total)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_compiled_kernel_gives_f_linear_for_every_measured_config(rows, dtype):
    from specexec.executor.layers.triton_kernels import fused_ops
    from specexec.executor.layers.triton_kernels.skinny_gemm import MEASURED, skinny_gemm

    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in ((960, 576), (4096, 1536), (100, 300)):
        x = torch.randn(rows, k, device="cuda", generator=gen).to(dtype)
        residual = torch.randn(rows, k, device="cuda", generator=gen).to(dtype)
        w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(dtype)
        bias = torch.randn(n, device="cuda", generator=gen).to(dtype)
        norm_w = torch.randn(k, device="cuda", generator=gen).to(dtype)
        for config in MEASURED:
            got, _ = skinny_gemm(x, w, bias, config)
            want = F.linear(x.float(), w.float(), bias.float())
            torch.testing.assert_close(got.float(), want, rtol=1 / 64, atol=1 / 64)
            got, total = skinny_gemm(x, w, None, config, (residual, norm_w, 1e-6, False))
            h, want_total = fused_ops.add_rms_norm(x, residual, norm_w, 1e-6, False)
            torch.testing.assert_close(got.float(), F.linear(h.float(), w.float()), rtol=1 / 64, atol=1 / 64)
            assert torch.equal(total, want_total)


@pytest.mark.parametrize("arch", [pytest.param("llama", marks=gpu), pytest.param("gemma2", marks=gpu)])
def test_an_executor_on_the_skinny_kernel_gives_the_tokens_of_cublas(arch, monkeypatch):
    """bfloat16 with graphs and NGram drafts: every projection forced onto one config at every bucket
    (the measurement may pick cuBLAS for a tiny model), against every projection on cuBLAS: the same
    first tokens, log-probabilities within bfloat16's rounding, every page free."""
    from specexec.executor.layers.triton_kernels.skinny_gemm import MEASURED

    forced = {}

    def choose(model, max_rows):
        choice = choose_skinny_kernels(model, max_rows)
        for _, proj, _ in skinny_linear.wrap_projections(model):
            proj.configs = dict(forced)
        return choice

    monkeypatch.setattr("specexec.executor.kernel_plan.plan.choose_skinny_kernels", choose)
    prompts = make_prompts(4, [3, 12, 7, 20], seed=5)
    prompts[1] = [5, 6, 7, 8] * 3
    results = {}
    for name, configs in (("cublas", {}), ("skinny", dict.fromkeys(skinny_linear.ROW_BUCKETS, MEASURED[0]))):
        forced.clear()
        forced.update(configs)
        _, model = make_tiny_model(arch, dtype=torch.bfloat16)
        config = ExecutorConfig(
            device="cuda", dtype="bfloat16", num_kv_blocks=128, block_size=4, max_batch_size=4,
            speculative_config={"decoding_type": "NGram", "max_draft_len": 3},
        )  # fmt: skip
        with Executor(model, config) as executor:
            projections = skinny_linear.wrap_projections(executor.core.runner.model)
            assert projections and all(p.configs == configs for _, p, _ in projections)
            params = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=0)
            results[name] = executor.run(
                [Request(p, params, request_id=f"r{i}") for i, p in enumerate(prompts)]
            )
            bm = executor.block_manager
            assert bm.num_free_blocks == bm.num_blocks
    for fast, reference in zip(results["skinny"], results["cublas"]):
        assert fast.error is None and fast.token_ids[:2] == reference.token_ids[:2]
        first = [fast.logprobs[0].logprob, reference.logprobs[0].logprob]
        assert abs(first[0] - first[1]) < 0.05
