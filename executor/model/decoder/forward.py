"""The own decoder's forward over a flat batch: embed, the layers (each as one C++ op where
`fused_layer.py` can run it), the final norm and the LM head only over the rows that need logits.

It reads the model's modules at every call (``model.model.layers``, ``model.lm_head``, ...), so layers
that quantization or packing replaced after conversion run as replaced. Hidden states are recorded where
asked, numbered as transformers numbers them: 0 = the embeddings, i = the output of layer i - 1, and
the last (= the number of layers) after the final norm.
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention_metadata import AttentionMetadata
from .convert import is_own_decoder
from .fused_layer import FusedStep, fused_args, fused_stack, run_fused, run_stack


class OwnDecoder:
    """Runs a model converted by `convert.convert_to_own_decoder`."""

    def __init__(self, model: nn.Module) -> None:
        if not is_own_decoder(model):
            raise ValueError(f"{type(model).__name__} has not been converted to specexec's decoder")
        self.model = model
        config = model.config.get_text_config()
        self.num_layers = len(model.model.layers)
        self.final_softcap = getattr(config, "final_logit_softcapping", None)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        meta: AttentionMetadata,
        logit_indices: torch.Tensor | None,  # [R] rows that need logits (None: every row)
        capture: tuple[int, ...] = (),  # hidden-state indices to record
        layers: nn.ModuleList | None = None,  # a subset of the decoder's layers to run (LayerSkip's draft)
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:  # logits [R, vocab], {index: [T, hidden]}
        """The logits of the rows asked for; with ``layers``, only those of the decoder's layers run (each
        on its own KV pool, `layer.spec.layer_idx`), and ``capture`` must be empty."""
        decoder = self.model.model
        if layers is not None and capture:
            raise ValueError("hidden states are numbered by the full stack: capture nothing over a subset")
        layers = decoder.layers if layers is None else layers
        hidden = decoder.embed_tokens(input_ids)  # [T, hidden]
        rows = {name: table.rows(positions) for name, table in decoder.rotary_tables.items()}
        captured = {0: hidden} if 0 in capture else {}
        residual = None
        step = FusedStep.of(meta, hidden)  # None: every layer runs in Python
        num_tokens, dtype = hidden.shape[0], hidden.dtype
        stack = None if step is None else fused_stack(layers, num_tokens, dtype)
        if stack is not None:  # every layer in one C++ op (`fused_layer.py`)
            inner = [i for i in sorted(capture) if 0 < i < self.num_layers]
            hidden, residual, states = run_stack(stack, hidden, rows[stack.rotary], meta, step, inner)
            captured.update(zip(inner, states))
        else:
            for i, layer in enumerate(layers):
                args = None if step is None else fused_args(layer, num_tokens, dtype)
                if args is not None:  # the whole layer as one C++ op (`fused_layer.py`)
                    hidden, residual = run_fused(
                        layer, args, hidden, residual, rows[layer.spec.rotary], meta, step
                    )
                else:
                    hidden, residual = layer(hidden, residual, rows[layer.spec.rotary], meta)
                if i + 1 in capture and i + 1 < self.num_layers:
                    captured[i + 1] = residual + hidden
        out = hidden if residual is None else residual + hidden  # [T, hidden]
        if self.num_layers in capture:
            captured[self.num_layers] = normed = decoder.norm(out)
            last = normed if logit_indices is None else normed[logit_indices]
        else:
            last = decoder.norm(out if logit_indices is None else out[logit_indices])  # [R, hidden]
        logits = self.model.lm_head(last)  # [R, vocab]
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits, captured
