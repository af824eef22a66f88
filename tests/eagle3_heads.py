"""Random EAGLE-3 heads for the tiny targets, and what the heads' tests compare them with.

- `make_head_dir`: a random head (hidden 32, vocab 256 unless said) written in the published layout;
- `eagle_spec`: the speculative_config that drafts with a head directory;
- `dense_causal_attention`: each query over every earlier key, directly (the head's attention by
  definition);
- `make_features`: one random sequence's training features for the heads' training tests.
"""

from __future__ import annotations

import torch
from specexec.drafters.eagle3.head import Eagle3Config, Eagle3Head, save_head
from specexec.drafters.eagle3.training.features import SequenceFeatures

VOCAB = 256  #: the tiny targets' vocabulary
DRAFT_VOCAB = 96


def make_head_dir(
    path,
    *,
    vocab: int = VOCAB,
    draft_vocab: int = DRAFT_VOCAB,
    aux_layers=(1, 2, 3),
    seed: int = 0,
    draft_ids=None,
    sliding_window: int | None = None,
):
    """A random head for the tiny targets (hidden 32, vocab 256 unless said) written in the published
    layout; its draft vocabulary is ``draft_ids`` or a random subset."""
    torch.manual_seed(seed)
    cfg = Eagle3Config(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        target_hidden_size=32,
        aux_layer_ids=aux_layers,
        sliding_window=sliding_window,
    )
    head = Eagle3Head(cfg)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    if draft_ids is None:
        draft_ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:draft_vocab]
    draft_ids = torch.as_tensor(draft_ids).sort().values
    head.d2t.copy_(draft_ids - torch.arange(draft_vocab))
    head.t2d.zero_()
    head.t2d[draft_ids] = True
    save_head(head, path, dtype=torch.float64)
    return path


def eagle_spec(head_dir, k: int = 3) -> dict:
    return {"decoding_type": "Eagle", "max_draft_len": k, "speculative_model": str(head_dir)}


def dense_causal_attention(q, k, v, window: int | None = None):  # [T, heads | kv_heads, d]
    """Each query over every earlier key (the last ``window`` of them only, when given)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * q.shape[-1] ** -0.5
    seen = torch.ones(len(q), len(k), dtype=torch.bool).tril()
    if window is not None:
        seen = seen & ~torch.ones(len(q), len(k), dtype=torch.bool).tril(-window)
    scores = scores.masked_fill(~seen, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def make_features(n: int, seed: int) -> SequenceFeatures:
    """``n`` positions of random features (3 aux layers of the hidden 32 targets) after position 3."""
    gen = torch.Generator().manual_seed(seed)
    return SequenceFeatures(
        token_ids=torch.randint(0, 256, (n + 1,), generator=gen),
        start_pos=3,
        aux=torch.randn(n, 96, generator=gen),
        final=torch.randn(n, 32, generator=gen),
    )
