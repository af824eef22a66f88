"""Training features for an EAGLE-3 head.

The target's hidden states come from the corpus generation itself (the executor captures them in the
forwards that generate the answers: no second pass over the corpus). Per position: the three auxiliary
features the head is fed (``hidden_states[i]`` for the head's layer ids) and the final normed hidden
state, from which the training loop recomputes the target's distribution over the draft vocabulary
(``final @ lm_head[draft ids].T``) instead of storing wide rows. A long sequence keeps only its last
positions (its answer and the prompt just before it), computed over the whole context. Only positions
whose next-but-one token belongs to the answer are scored (as EAGLE masks the loss to the assistant's
turn): the prompt's positions are context the head attends, not what it will draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(slots=True)
class SequenceFeatures:
    token_ids: torch.Tensor  # [n + 1] int64: the tokens of the kept positions, and the one after them
    start_pos: int  #: position of token_ids[0] in the whole sequence
    aux: torch.Tensor  # [n, 3 * target_hidden] bfloat16: the head's input features
    final: torch.Tensor  # [n, target_hidden] bfloat16: last hidden state after the final norm
    answer_start: int = 0  #: position of the answer's first token; earlier targets are not scored


def load_features(
    records: list[dict], corpus_dir: Path, target_hidden: int, device: torch.device | str = "cpu"
) -> list[SequenceFeatures]:
    """The features the corpus generation saved: [n, 4 * target_hidden] rows (three auxiliary layers,
    then the final one) for the last n positions fed to the target, on ``device`` (a GPU holds a
    million positions in 4.6 GB: batches are then cut there, with no copy per step)."""
    features = []
    for r in records:
        rows = torch.load(corpus_dir / r["features"]).to(device)
        ids = r["prompt_token_ids"] + r["output_token_ids"]
        n = rows.shape[0]
        if n < 3:
            continue
        start = len(ids) - 1 - n  # every token but the last was fed
        features.append(
            SequenceFeatures(
                torch.tensor(ids[start:], device=device),
                start,
                rows[:, : 3 * target_hidden],
                rows[:, 3 * target_hidden :],
                answer_start=len(r["prompt_token_ids"]),
            )
        )
    return features
