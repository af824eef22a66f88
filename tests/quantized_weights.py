"""Random weights for the quantization tests: a float linear layer, and int4 codes as a file stores them."""

from __future__ import annotations

import torch
from specexec.executor.layers.quantized.quantized_dot import BLOCK
from specexec.executor.layers.quantized.quantized_linear import Int4Weights


def random_linear(out_features=64, in_features=96, seed=0, bias=False) -> torch.nn.Linear:
    """A float32 linear layer of small normal weights (std 0.05), frozen."""
    torch.manual_seed(seed)
    layer = torch.nn.Linear(in_features, out_features, bias=bias)
    torch.nn.init.normal_(layer.weight, std=0.05)
    return layer.requires_grad_(False)


def random_q4(out_features: int, in_features: int, seed: int) -> Int4Weights:
    """Random int4 codes with a float16 scale and offset per group of BLOCK inputs."""
    gen = torch.Generator().manual_seed(seed)
    groups = in_features // BLOCK
    q = torch.randint(0, 16, (out_features, in_features), generator=gen, dtype=torch.uint8)
    scale = (
        (torch.rand(out_features, groups, generator=gen) * 0.02).half().float()
    )  # float16 values, as stored
    offset = (-torch.rand(out_features, groups, generator=gen) * 0.15).half().float()
    return Int4Weights(q, scale, offset)
