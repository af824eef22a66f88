"""Medusa heads for the tiny test targets, written to a directory as `specexec train-medusa` writes them."""

from __future__ import annotations

from pathlib import Path

import torch
from specexec.drafters.medusa.heads import MedusaConfig, new_heads, save_heads
from specexec.drafters.training.draft_vocab import d2t_for
from tiny_models import make_tiny_model


def make_medusa_dir(
    path: Path,
    arch: str = "llama",
    num_heads: int = 4,
    draft_ids: torch.Tensor | None = None,
    noise: float = 0.02,
    seed: int = 0,
    **model_overrides,
) -> Path:
    """Heads for ``make_tiny_model(arch, **model_overrides)``: each starts as the target's LM head over
    the draft vocabulary ``draft_ids`` (sorted target ids; default every id), its residual block small
    random weights (``noise``). A tiny random target often repeats a token, so these heads' drafts
    (mostly the bonus token again) are accepted now and then; float32 on disk, as a trained head's."""
    _, model = make_tiny_model(arch, **model_overrides)
    text = model.config.get_text_config()
    draft_ids = torch.arange(text.vocab_size) if draft_ids is None else draft_ids
    draft_vocab = len(draft_ids)
    cfg = MedusaConfig(text.hidden_size, text.vocab_size, draft_vocab, num_heads)
    lm_rows = model.get_output_embeddings().weight[draft_ids].float()
    heads = new_heads(cfg, lm_rows, d2t_for(draft_ids))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in heads.blocks:
            block.weight.copy_(noise * torch.randn(block.weight.shape, generator=generator))
    save_heads(heads, path, dtype=torch.float32)
    return path
