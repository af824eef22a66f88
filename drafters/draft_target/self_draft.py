"""The self-draft: the target itself at a lower weight precision, drafting for the target."""

from __future__ import annotations

import torch

from ..base import DrafterContext


def self_draft(context: DrafterContext, quantization: str):
    """The target at ``quantization``: loaded again from its file when the target's own layers are
    quantized already (the file has the weights before that), else a quantized copy of the target
    module (of its dequantized weights where it is quantized and was passed in as a module)."""
    from ...executor.model.model_loader import load_model
    from .quantized_copy import has_quantized_layers, quantized_copy

    target = context.target_model
    dtype = self_draft_dtype(context, quantization)
    if context.target_path is None or not has_quantized_layers(target):
        return quantized_copy(target, quantization, context.target_path, getattr(torch, dtype))
    return load_model(
        context.target_path,
        dtype=dtype,
        device=str(next(target.parameters()).device),
        cache_dir=context.executor_config.cache_dir,
        quantization=quantization,
        progress=False,
        model_impl=context.executor_config.model_impl,
    ).model


def self_draft_dtype(context: DrafterContext, quantization: str) -> str:
    """The self-draft's dtype: the target's, except a float32 target's draft takes what ``dtype: auto``
    measures for the quantized weights (on the AVX512-BF16 machine the int8 kernel took ~10x longer
    with float32 activations than with bfloat16 ones, so a float32 draft would cost more than the
    target). The draft's dtype does not touch the output: the target verifies every token."""
    from ...executor.kernel_plan.dtype import choose_dtype
    from ...executor.layers.measurement.cache_folder import resolve_cache_dir

    param = next(context.target_model.parameters())
    dtype = str(param.dtype).removeprefix("torch.")
    if (kernel_dtype := cuda_kernel_dtype(param.device, param.dtype, quantization)) is not None:
        return kernel_dtype
    if param.dtype != torch.float32:
        return dtype
    shape = context.target_model.config.get_text_config().to_dict()
    config = context.executor_config
    return choose_dtype(
        param.device, shape, resolve_cache_dir(config.cache_dir), quantization, config.quantized_kernel
    ).dtype


def cuda_kernel_dtype(device: torch.device, dtype: torch.dtype, quantization: str) -> str | None:
    """On CUDA, for a target whose dtype ``quantization``'s kernels do not run in (a float64 target with
    int8 weights), the first dtype they do run in; else None. (On the CPU every dtype runs.)"""
    from ...executor.layers.quantized.quantized_linear import CUDA_KERNEL_DTYPES, kernel_scheme

    kernel_dtypes = CUDA_KERNEL_DTYPES.get(kernel_scheme(quantization))
    if device.type != "cuda" or kernel_dtypes is None or dtype in kernel_dtypes:
        return None
    return str(kernel_dtypes[0]).removeprefix("torch.")
