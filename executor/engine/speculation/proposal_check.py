"""What a drafter answered, made safe to verify: drafts cut to the reserved slots and at the first id
outside the vocabulary; nothing at all for an answer that is not a `DraftProposal`, a draft distribution
q that is not a finite, non-negative [drafts, vocab] tensor, or parents that do not make a token tree of
the drafts (`sampling/tree_shape.is_tree`). Every draft is still verified by the target."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ....drafters.base import DraftProposal
from ....sampling.tree_shape import is_tree


@dataclass(slots=True)
class CheckedProposal:
    tokens: list[int]
    probs: torch.Tensor | None = None  # [len(tokens), vocab]
    parents: list[int] | None = None  #: a token tree's (None: a chain)
    is_garbage: bool = False  #: the answer broke the hook's promise (counted; its drafts dropped)


def checked_proposal(proposal, num_slots: int, vocab_size: int) -> CheckedProposal:
    if proposal is None:
        return CheckedProposal([])
    if not isinstance(proposal, DraftProposal):
        return CheckedProposal([], is_garbage=True)
    try:
        candidates = list(proposal.token_ids)[:num_slots]
        parents = None if proposal.parents is None else list(proposal.parents)
    except TypeError:  # token_ids (or parents) is not a sequence
        return CheckedProposal([], is_garbage=True)
    if parents is not None and not is_tree(parents[: len(candidates)], len(candidates)):
        return CheckedProposal([], is_garbage=True)  # not a tree of these drafts: none can be verified
    tokens = []
    for t in candidates:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            break  # cut at the first id that is not a token of this vocabulary
        tokens.append(t)
    if not tokens:
        return CheckedProposal([])
    probs = proposal.probs
    if probs is not None:
        probs = _checked_probs(probs, len(tokens), vocab_size)
        if probs is None:  # q that is not a distribution cannot be verified losslessly
            return CheckedProposal([], is_garbage=True)
    return CheckedProposal(tokens, probs, parents[: len(tokens)] if parents is not None else None)


def _checked_probs(probs, num_tokens: int, vocab_size: int) -> torch.Tensor | None:
    """q [num_tokens, vocab] when it is a finite, non-negative distribution per row, else None."""
    if (
        not isinstance(probs, torch.Tensor)
        or probs.dim() != 2
        or probs.shape[0] < num_tokens
        or probs.shape[1] < vocab_size
        or not probs.is_floating_point()
    ):
        return None
    q = probs[:num_tokens, :vocab_size]
    row_sums = q.sum(dim=-1)  # [num_tokens]
    if not bool(torch.isfinite(row_sums).all() and (q >= 0).all() and (row_sums > 0).all()):
        return None
    return q
