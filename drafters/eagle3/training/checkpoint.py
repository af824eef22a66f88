"""What lets `specexec train-eagle3` continue across runs: a validation split that stays the same as the
corpus grows, and a checkpoint of the head, its optimizer and the training state.

The split is by the hash of each answer's prompt id (a sampled answer goes with its greedy twin), so an
answer is validation data in every run or in none. The checkpoint keeps the draft vocabulary too: the
vocabulary is chosen once, from the corpus the first run saw, and kept (a head's d2t cannot change
under its weights). It is written to a temporary file and renamed, so a killed run leaves the last
complete one.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

CHECKPOINT_NAME = "checkpoint.pt"
VALIDATION_SHARE = 25  #: one prompt in this many is held out for validation


def is_validation(record_id: str) -> bool:
    prompt_id = record_id.removesuffix("~s")
    return int(hashlib.sha256(prompt_id.encode()).hexdigest(), 16) % VALIDATION_SHARE == 0


def split_records(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(training, validation) records; validation is never empty when there are records."""
    val = [r for r in records if is_validation(r["id"])]
    train = [r for r in records if not is_validation(r["id"])]
    if not val and train:  # a tiny corpus with no validation prompt: hold out the first one
        val, train = train[:1], train[1:]
    return train, val


def validation_key(val_records: list[dict]) -> str:
    """Names the validation split: a grown corpus adds answers to it, and scores measured on the old
    split no longer compare with new ones."""
    ids = "\n".join(sorted(r["id"] for r in val_records))
    return hashlib.sha256(ids.encode()).hexdigest()[:16]


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
