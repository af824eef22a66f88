"""Training rows for Medusa heads: the target's final hidden state at each answer position, and the
tokens the heads should draft from it.

The corpus is the one EAGLE-3 trains on too (`drafters/training/corpus.py`): the target's greedy
answers, their features rebuilt by a prefill that captures ``hidden_states[num_layers]``. At position ``t`` of a
sequence ``x``, the target's LM head gives ``x_{t+1}`` (the bonus token of a step ending there) and head
``k`` is trained to give ``x_{t+k+1}``: in a greedy answer that is the target's own greedy token, the one
verification accepts. Only greedy answers are used (a sampled answer's tokens are not what greedy
verification accepts), and a position counts when ``x_{t+1}`` belongs to the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

IGNORE = -100  #: a label no head is scored on (past the sequence's end, or outside the draft vocabulary)


@dataclass(slots=True)
class MedusaRows:
    hidden: torch.Tensor  # [N, hidden] bfloat16: the target's final normed hidden state at each position
    labels: torch.Tensor  # [N, num_heads] int64: head k's draft-vocabulary id of x_{t+k+1}, or IGNORE

    def __len__(self) -> int:
        return self.hidden.shape[0]


def is_greedy(record: dict) -> bool:
    return not record["id"].endswith("~s")


def load_rows(records: list[dict], corpus_dir: Path, num_heads: int, t2d: torch.Tensor) -> MedusaRows:
    """The answer positions of ``records`` (greedy ones only) with their labels; ``t2d`` [vocab] maps a
    target id to its draft id (-1: not in the draft vocabulary)."""
    hidden, labels = [], []
    for r in filter(is_greedy, records):
        rows = torch.load(corpus_dir / r["features"])  # [n, hidden]: the last n positions fed
        ids = torch.tensor(r["prompt_token_ids"] + r["output_token_ids"])
        n = rows.shape[0]
        start = len(ids) - 1 - n  # position of rows[0]
        first = max(0, len(r["prompt_token_ids"]) - 1 - start)  # x_{t+1} is the answer's from here on
        if first >= n:
            continue
        positions = torch.arange(start + first, start + n)  # [m]
        targets = positions[:, None] + torch.arange(2, num_heads + 2)  # [m, K]: x_{t+k+1}
        inside = targets < len(ids)
        label = t2d[ids[targets.clamp(max=len(ids) - 1)]]  # [m, K]
        label[~inside | (label < 0)] = IGNORE
        hidden.append(rows[first:].to(torch.bfloat16))
        labels.append(label)
    if not hidden:
        raise ValueError("the corpus has no greedy answer to train Medusa heads on")
    return MedusaRows(torch.cat(hidden), torch.cat(labels))


def draft_index(draft_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[vocab] int64: each target id's draft id, -1 for those outside the draft vocabulary."""
    t2d = torch.full((vocab_size,), -1, dtype=torch.long)
    t2d[draft_ids] = torch.arange(len(draft_ids))
    return t2d
