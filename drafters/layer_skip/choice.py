"""Which layers LayerSkip skips: candidate sets scored on calibration text at start-up.

Each candidate keeps the first and the last layer (the embedding's and the head's neighbours matter
most) and skips either every other layer from some depth on, or one contiguous block. A candidate is
scored by how often the subset's greedy token agrees with the full model's over the full model's own
greedy continuation of a few calibration prompts (one prefill over prompt + continuation per
candidate; the subset computes its own K/V for the whole text there, so this is a pessimistic proxy
for drafting, whose earlier positions carry the full model's K/V). The winner maximizes the tokens a
chain of ``k`` drafts yields per unit of time when a draft costs the share of layers it runs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SkipCandidate:
    name: str
    skipped: tuple[int, ...]


def candidate_sets(num_layers: int) -> list[SkipCandidate]:
    """The skip sets tried (for 4+ layers): alternate layers from 1/4, 1/3 and 1/2 of the depth, and
    contiguous blocks of a quarter and a third in the upper middle."""
    if num_layers < 4:
        return []
    last = num_layers - 1
    found: dict[tuple[int, ...], str] = {}
    for share, label in ((4, "1/4"), (3, "1/3"), (2, "1/2")):
        start = max(1, num_layers // share)
        skipped = tuple(range(start + 1, last, 2))
        if skipped:
            found.setdefault(skipped, f"every other layer from {label} of the depth")
    for share, label in ((4, "a quarter"), (3, "a third")):
        size = max(1, num_layers // share)
        begin = max(1, (num_layers - size) // 2 + size // 2)
        skipped = tuple(range(begin, min(last, begin + size)))
        if skipped:
            found.setdefault(skipped, f"{label} of the layers, contiguous, upper middle")
    return [SkipCandidate(name, skipped) for skipped, name in found.items()]


def expected_speedup(agreement: float, run_share: float, k: int) -> float:
    """Tokens per forward-time of a k-draft chain with per-draft acceptance ``agreement``, a draft
    costing ``run_share`` of a forward and the verify one forward."""
    a = min(max(agreement, 0.0), 0.999)
    tokens = (1 - a ** (k + 1)) / (1 - a)
    return tokens / (1 + k * run_share)
