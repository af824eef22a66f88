"""What the benchmark measures: one record per request, aggregated per (configuration, concurrency)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class RequestRecord:
    id: str
    num_prompt_tokens: int
    num_output_tokens: int
    latency_ms: float
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    finish_reason: str = "length"
    num_decode_steps: int = 0  #: target forwards after the first token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_grammar_rejected_drafts: int = 0  #: drafts dropped or rejected because the grammar forbids them
    num_forced_tokens: int = 0  #: grammar-forced (jump-forward) tokens proposed as drafts
    mask_wait_ms: float = 0.0  #: time the loop waited for this request's grammar masks
    error: str | None = None
    proposed_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    schema_valid: bool | None = None  #: None when the prompt has no schema
    text: str = ""
    turn: int = 1  #: the conversation's turn (multi-turn sets; 1 otherwise)
    num_cached_tokens: int = 0  #: prompt tokens taken from the prefix cache instead of computed
    #: output tokens in the run's stop set (`stop_tokens.py`): 0 with --ignore-eos, else 1 when it ended on
    #: one; None when the engine did not say which tokens it sampled
    num_stop_tokens: int | None = 0


def percentile(values: list[float], q: float) -> float | None:
    """numpy's (linear interpolation), the one percentile of the code base; None when there are none."""
    import numpy as np

    values = [v for v in values if v is not None]
    return float(np.percentile(values, q)) if values else None


def _position_rates(records: list[RequestRecord]) -> list[float]:
    size = max((len(r.proposed_per_position) for r in records), default=0)
    proposed, accepted = [0] * size, [0] * size
    for r in records:
        for i, (p, a) in enumerate(zip(r.proposed_per_position, r.accepted_per_position)):
            proposed[i] += p
            accepted[i] += a
    return [a / p if p else 0.0 for p, a in zip(proposed, accepted)]


def summarize(
    name: str, concurrency: int, records: list[RequestRecord], wall_s: float, extra: dict | None = None
):
    """The result row of one configuration at one concurrency."""
    out_tokens = sum(r.num_output_tokens for r in records)
    steps = sum(r.num_decode_steps for r in records)
    accepted = sum(r.num_accepted_tokens for r in records)
    drafted = sum(r.num_draft_tokens for r in records)
    per_user = [1000.0 / r.tpot_ms for r in records if r.tpot_ms]
    valid = [r.schema_valid for r in records if r.schema_valid is not None]
    prompt_tokens = sum(r.num_prompt_tokens for r in records)
    row: dict[str, Any] = {
        "name": name,
        "concurrency": concurrency,
        "num_requests": len(records),
        "num_failed": sum(r.error is not None for r in records),  #: each one's error is in ``requests``
        "wall_s": wall_s,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / wall_s if wall_s > 0 else None,
        "per_user_tokens_per_s": sum(per_user) / len(per_user) if per_user else None,
        "mean_acceptance_length": (steps + accepted) / steps if steps and drafted else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "acceptance_per_position": _position_rates(records),
        # what the draft-length policy did: the share of decode steps that verified at least one draft
        "drafted_share": sum(r.proposed_per_position[0] for r in records if r.proposed_per_position) / steps
        if steps and drafted
        else None,
        "schema_valid_rate": sum(valid) / len(valid) if valid else None,
        "cached_share": sum(r.num_cached_tokens for r in records) / prompt_tokens if prompt_tokens else None,
        "num_stop_tokens": None
        if any(r.num_stop_tokens is None for r in records)
        else sum(r.num_stop_tokens for r in records),
        "speedup": {},
    }
    for key, values in (
        ("ttft_ms", [r.ttft_ms for r in records]),
        ("tpot_ms", [r.tpot_ms for r in records]),
        ("latency_ms", [r.latency_ms for r in records]),
    ):
        for q in (50, 90, 99):
            row[f"{key}_p{q}"] = percentile(values, q)
    if any(r.turn > 1 for r in records):  # the turns that can reuse the conversation's earlier ones
        row["ttft_later_turns_ms_p50"] = percentile([r.ttft_ms for r in records if r.turn > 1], 50)
    row.update(extra or {})
    row["requests"] = [asdict(r) for r in records]
    return row


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def schema_valid(text: str, schema: dict | None) -> bool | None:
    """Does the output (or the JSON inside a code fence in it) validate against the schema?"""
    if schema is None:
        return None
    import jsonschema

    match = _FENCE.search(text)
    candidate = (match.group(1) if match else text).strip()
    try:
        jsonschema.validate(json.loads(candidate), schema)
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True
