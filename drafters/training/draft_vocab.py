"""The reduced draft vocabulary that EAGLE-3 and Medusa heads draft over: chosen from a training corpus
(its most frequent tokens), stored in a head's file as ``d2t`` (target id = draft id + d2t[draft id]),
and checked when a head is loaded."""

from __future__ import annotations

from collections import Counter

import torch


def choose_draft_vocab(
    records: list[dict], size: int, vocab_size: int, always: tuple[int, ...] = ()
) -> torch.Tensor:
    """The ``size`` most frequent tokens of the corpus (answers counted twice: they are what is
    drafted), plus ``always`` (e.g. EOS); sorted target ids [size]."""
    if not 1 <= size <= vocab_size:
        raise ValueError(f"draft vocabulary size must be in 1..{vocab_size}, got {size}")
    counts: Counter[int] = Counter()
    for r in records:
        counts.update(r["prompt_token_ids"])
        counts.update(r["output_token_ids"])
        counts.update(r["output_token_ids"])
    chosen = [t for t in dict.fromkeys(always) if 0 <= t < vocab_size]
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if token not in chosen:
            chosen.append(token)
    taken = set(chosen)
    filler = (t for t in range(vocab_size) if t not in taken)  # a tiny corpus: pad with low ids
    while len(chosen) < size:
        chosen.append(next(filler))
    return torch.tensor(sorted(chosen), dtype=torch.long)


def d2t_for(draft_ids: torch.Tensor) -> torch.Tensor:
    """[draft_vocab] offsets: target id = draft id + d2t[draft id] (draft ids are the sorted targets)."""
    return draft_ids - torch.arange(len(draft_ids))


def check_d2t(d2t: torch.Tensor, vocab_size: int, what: str) -> None:
    """The map must send every draft id to a distinct target id inside the vocabulary (``what``: the
    heads named in the error)."""
    target = torch.arange(len(d2t)) + d2t
    if len(target) and (target.min() < 0 or target.max() >= vocab_size):
        raise ValueError(f"{what}: d2t maps draft ids outside the vocabulary")
    if len(set(target.tolist())) != len(target):
        raise ValueError(f"{what}: d2t maps two draft ids onto one target token")
