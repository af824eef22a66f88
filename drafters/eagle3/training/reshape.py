"""A head to train further, changed in shape first (`specexec train-eagle3 --init-from`): a new draft
vocabulary (``--fresh-vocab``) or a wider MLP (``--mlp-width``). Each change keeps what the head has
learnt: the new head computes what the old one did on everything the old one could draft."""

from __future__ import annotations

from dataclasses import replace

import torch

from ...training.draft_vocab import d2t_for
from ..head import Eagle3Head


def trainable(head: Eagle3Head) -> Eagle3Head:
    """``head`` in training mode with every weight trained but its own embeddings (the target's)."""
    head.train().requires_grad_(True)
    if head.embed_tokens is not None:
        head.embed_tokens.requires_grad_(False)
    return head


def with_draft_vocab(head: Eagle3Head, draft_ids: torch.Tensor, output_rows: torch.Tensor) -> Eagle3Head:
    """``head`` drafting over ``draft_ids`` instead (``--fresh-vocab``): every weight but the lm_head is
    kept; a token the head already drafted keeps its trained lm_head row, a new one starts from the
    target's output row (``output_rows``: the target's [vocab, hidden] lm_head) plus the mean amount by
    which the head's trained rows moved from the target's. Without that shift the new rows outbid the
    trained ones: the shipped head's validation agreement at step 0 fell from 0.31 to 0.23; with it, 0.31."""
    cfg = replace(head.config, draft_vocab_size=len(draft_ids))
    new = _same_but(head, cfg, skip=("lm_head.", "d2t", "t2d"))
    old_ids = head.t2d.nonzero()[:, 0]
    trained = head.lm_head.weight.detach()  # [old draft vocab, hidden]
    shift = (trained.float() - output_rows[old_ids].float()).mean(0)  # [hidden]
    rows = (output_rows[draft_ids].float() + shift).to(trained.dtype)  # [draft vocab, hidden]
    row_of = torch.full((cfg.vocab_size,), -1, dtype=torch.long)  # target id -> the head's old row
    row_of[old_ids] = torch.arange(len(old_ids))
    had = row_of[draft_ids] >= 0
    rows[had] = trained[row_of[draft_ids][had]]
    with torch.no_grad():
        new.lm_head.weight.copy_(rows)
        new.d2t.copy_(d2t_for(draft_ids))
        new.t2d.zero_()
        new.t2d[draft_ids] = True
    return trainable(new)


def with_mlp_width(head: Eagle3Head, width: int, seed: int = 0) -> Eagle3Head:
    """``head`` with ``width`` MLP units (``--mlp-width``), at least as many as it has. Its units keep
    their weights; each new unit's gate and up rows are drawn like the trained rows (normal, with their
    standard deviation) and its down_proj column is zero, so the new head's outputs equal the old
    head's until training moves those columns (their gradient is not zero: the units' activations are
    not)."""
    old = head.config.intermediate_size
    if width < old:
        raise ValueError(f"--mlp-width {width}: the head to start from already has {old} MLP units")
    if width == old:
        return head
    new = _same_but(head, replace(head.config, intermediate_size=width), skip=("midlayer.mlp.",))
    generator = torch.Generator().manual_seed(seed)
    before, after = head.midlayer.mlp, new.midlayer.mlp
    with torch.no_grad():
        for name in ("gate_proj", "up_proj"):  # [units, hidden]
            trained = getattr(before, name).weight
            rows = torch.randn(width - old, trained.shape[1], generator=generator) * trained.float().std()
            getattr(after, name).weight.copy_(torch.cat([trained, rows.to(trained.dtype)]))
        down = before.down_proj.weight  # [hidden, units]
        after.down_proj.weight.copy_(torch.cat([down, down.new_zeros(down.shape[0], width - old)], dim=1))
    return trainable(new)


def _same_but(head: Eagle3Head, cfg, skip: tuple[str, ...]) -> Eagle3Head:
    """A head of config ``cfg`` holding ``head``'s weights but those whose names start with ``skip``."""
    new = Eagle3Head(cfg, head._target_embeddings[0])
    new.embed_tokens = head.embed_tokens
    kept = {k: v for k, v in head.state_dict().items() if not k.startswith(skip)}
    new.load_state_dict(kept, strict=False)
    return new.to(head.norm.weight.dtype)
