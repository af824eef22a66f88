"""The validation split of a training corpus, the same in every run as the corpus grows: what `specexec
train-eagle3` scores a head on across the runs that continue it, and what `specexec train-medusa` holds
out.

The split is by the hash of each answer's prompt id (a sampled answer goes with its greedy twin), so an
answer is validation data in every run or in none.
"""

from __future__ import annotations

import hashlib

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
