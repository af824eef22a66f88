"""What lets `specexec train-eagle3` continue across runs: a checkpoint of the head, its optimizer and
the training state (scored on a validation split that stays the same as the corpus grows:
`drafters/training/validation_split.py`).

The checkpoint keeps the draft vocabulary too: the vocabulary is chosen once, from the corpus the first
run saw, and kept (a head's d2t cannot change under its weights). It is written to a temporary file and
renamed, so a killed run leaves the last complete one.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

CHECKPOINT_NAME = "checkpoint.pt"


@dataclass(slots=True)
class TrainingState:
    step: int = 0  #: optimizer steps over every run
    epoch: int = 0  #: passes over the training split (that run's)
    best_score: float = 0.0  #: the best validation estimate of the acceptance length so far
    best_step: int = 0
    evals_without_gain: int = 0
    val_key: str = ""  #: `validation_key` of the split best_score was measured on
    log: dict = field(default_factory=lambda: {"steps": [], "val": [], "runs": []})


def save_checkpoint(path: Path, head, optimizer, state: TrainingState, draft_ids: torch.Tensor, best) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "head": head.state_dict(),
            "best_head": best,
            "optimizer": optimizer.state_dict(),
            "state": asdict(state),
            "draft_ids": draft_ids,
        },
        tmp,
    )
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict | None:
    if not path.exists():
        return None
    data = torch.load(path, weights_only=False, map_location="cpu")  # a GPU run continues on a CPU
    data["state"] = TrainingState(**data["state"])
    return data
