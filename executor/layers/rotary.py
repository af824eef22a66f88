"""Rotary position embeddings from a position-indexed table, applied to the queries and keys of a layer.

The table holds, for every position a model can see, the cos and sin rows transformers' rotary module
gives (so rope scaling types with a fixed frequency table, such as linear, llama3 and yarn, come out
exactly as transformers computes them). A forward gathers the rows of its tokens' positions once and
every layer uses them. The rotation is transformers' ``x * cos + rotate_half(x) * sin`` with the sign of
``rotate_half`` folded into the sin table.
"""

from __future__ import annotations

import torch
from torch import nn


class RotaryTable(nn.Module):
    """cos and sin per position: ``table[position] = (cos [head_dim], sign * sin [head_dim])``."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:  # [max_positions, head_dim] each
        super().__init__()
        half = cos.shape[-1] // 2
        signed_sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
        self.register_buffer("table", torch.stack([cos, signed_sin], dim=1), persistent=False)

    @classmethod
    def from_module(cls, rotary: nn.Module, max_positions: int, dtype: torch.dtype, *args) -> RotaryTable:
        """The table of a transformers rotary-embedding module (``args``: e.g. Gemma3's layer type)."""
        device = next(rotary.buffers()).device
        positions = torch.arange(max_positions, device=device)[None]  # [1, max_positions]
        dummy = torch.zeros(1, dtype=dtype, device=device)
        with torch.no_grad():
            cos, sin = rotary(dummy, positions, *args)  # [1, max_positions, head_dim] each, in dtype
        return cls(cos[0], sin[0])

    @property
    def max_positions(self) -> int:
        return self.table.shape[0]

    def rows(self, positions: torch.Tensor) -> torch.Tensor:  # [num_tokens] -> [num_tokens, 2, 1, head_dim]
        """The cos and signed-sin rows of these positions, shaped to broadcast over heads."""
        return self.table.index_select(0, positions).unsqueeze(2)


def apply_rotary(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``x`` [num_tokens, heads, head_dim] rotated by `RotaryTable.rows` [num_tokens, 2, 1, head_dim]:
    x * cos + (x's halves swapped) * signed sin, a new tensor."""
    half = x.shape[-1] // 2
    swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)
    return torch.addcmul(x * rows[:, 0], swapped, rows[:, 1])
