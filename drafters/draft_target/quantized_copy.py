"""A weight-only quantized copy of a model (the self-speculative draft), through the executor's own
quantization (`executor/layers/quantized/quantization.py`): the same layers and kernels as a quantized target."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from ...executor.layers.quantized.quantization import dequantize_model, quantize_model
from ...executor.layers.quantized.quantized_linear import WeightOnlyLinear


def quantized_copy(
    model: nn.Module,
    quantization: str = "int8",
    gguf_path: Path | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """A deep copy of ``model`` (in ``dtype``, default its own) whose linear layers (lm_head included)
    are quantized; layers quantized already are quantized again from their dequantized weights
    (``gguf`` needs the model's GGUF file)."""
    draft = dequantize_model(copy.deepcopy(model))
    if dtype is not None:
        draft.to(dtype)
    quantize_model(draft, quantization, gguf_path if gguf_path is not None and gguf_path.is_file() else None)
    return draft.eval()


def has_quantized_layers(model: nn.Module) -> bool:
    return any(isinstance(m, WeightOnlyLinear) for m in model.modules())
