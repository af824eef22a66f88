"""A token embedding read from a quantized layer's codes: each looked-up row dequantized when asked, so
a GGUF's Q8_0 (or Q6_K, Q5_0, ...) embedding is not held a second time as a dense table. With a tied LM
head the table is the head's own layer (one copy of the codes for both); an untied embedding gets its
own. The rows are the values the dense table held (`Int8BlockLinear.weight_rows`: the file's, exactly),
in the dense table's dtype, times Gemma's ``embed_scale`` where the replaced module had one."""

from __future__ import annotations

import torch
from torch import nn

from .q8_block_linear import Int8BlockLinear


class QuantizedEmbedding(nn.Module):
    def __init__(self, embedding: nn.Embedding, table: Int8BlockLinear, shared: bool) -> None:
        """``table``: codes [num_embeddings, embedding_dim] (as a linear layer's [out, in]); ``shared``:
        it is the tied LM head's layer, which holds it (not registered here a second time)."""
        super().__init__()
        if (table.out_features, table.in_features) != tuple(embedding.weight.shape):
            raise ValueError(
                f"embedding {tuple(embedding.weight.shape)} and its codes {table.out_features}x"
                f"{table.in_features} differ"
            )
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features
        self.padding_idx = embedding.padding_idx
        self.weight_dtype = embedding.weight.dtype  #: the dense table's dtype: the rows come out in it
        if shared:
            self._shared = (table,)  # a tuple: the head's module, not a submodule here
        else:
            self.table = table
        scale = getattr(embedding, "embed_scale", None)  # Gemma's sqrt(hidden), a buffer
        self.register_buffer(
            "embed_scale", scale if isinstance(scale, torch.Tensor) else None, persistent=False
        )

    @property
    def codes(self) -> Int8BlockLinear:
        return self._shared[0] if hasattr(self, "_shared") else self.table

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [...] -> [..., embedding_dim]
        flat = input_ids.reshape(-1)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
            raise IndexError(f"token ids must be in 0..{self.num_embeddings - 1}")
        rows = self.codes.weight_rows(flat).to(self.weight_dtype)  # [N, embedding_dim]
        if self.embed_scale is not None:
            rows = rows * self.embed_scale.to(self.weight_dtype)  # as Gemma's module scales its rows
        return rows.reshape(*input_ids.shape, self.embedding_dim)

    @property
    def weight(self) -> torch.Tensor:  # [num_embeddings, embedding_dim]
        """The whole dense table, dequantized anew on each read (for callers that copy it, as the EAGLE-3
        training scripts do); the lookups never build it."""
        return self.codes.dequantized_by_torch(self.weight_dtype)

    def extra_repr(self) -> str:
        shared = ", shared with the LM head" if hasattr(self, "_shared") else ""
        return f"{self.num_embeddings}, {self.embedding_dim}, codes {self.codes.scheme}{shared}"
