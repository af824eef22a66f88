"""``--repeats N``: one row per (configuration, concurrency) out of its N passes.

One pass of 8 prompts on a shared machine moves by more than many of the differences it is asked to
show. The runner interleaves the passes (A, B, C, A, B, C, ...) so a slow spell falls on every
configuration alike; here each measured figure becomes the median of its passes with their spread
(min, max), speed-ups included (each pass's ratio against the same pass's baseline, then the median),
and the row keeps every pass as it was measured.
"""

from __future__ import annotations

import statistics
from numbers import Real

#: figures that name the row rather than measure it: taken from the first pass
FIXED_KEYS = frozenset({"name", "concurrency", "num_requests", "pass"})
#: counts whose total over the passes is what matters (one stop token in one pass must show)
SUMMED_KEYS = frozenset({"num_stop_tokens", "num_failed"})


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _median_and_spread(values: list) -> tuple[float | None, list[float] | None]:
    present = [v for v in values if v is not None]
    if not present:
        return None, None
    return statistics.median(present), [min(present), max(present)]


def combine_passes(rows: list[dict]) -> list[dict]:
    """Rows of several passes (each with ``pass``) -> one row per (name, concurrency), in the order of
    their first pass: medians, ``spread`` {figure: [min, max]}, ``num_passes`` and ``passes``."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["name"], row["concurrency"]), []).append(row)
    return [_combine(passes) for passes in groups.values()]


def _combine(passes: list[dict]) -> dict:
    first = passes[0]
    out: dict = {}
    spread: dict[str, list[float]] = {}
    for key, value in first.items():
        values = [p.get(key) for p in passes]
        if key == "requests":
            continue  # (each pass keeps its own)
        if key in SUMMED_KEYS:
            out[key] = None if any(v is None for v in values) else sum(values)
        elif key in FIXED_KEYS or not all(v is None or _is_number(v) for v in values):
            out[key] = value
        else:
            out[key], spread[key] = _median_and_spread(values)
    out["speedup"] = {}
    for label in {label for p in passes for label in p.get("speedup", {})}:
        ratios = [p.get("speedup", {}).get(label) for p in passes]
        out["speedup"][label], spread[f"speedup.{label}"] = _median_and_spread(ratios)
    positions = [p["acceptance_per_position"] for p in passes if p.get("acceptance_per_position")]
    if positions:
        size = min(len(rates) for rates in positions)
        out["acceptance_per_position"] = [statistics.median(r[i] for r in positions) for i in range(size)]
    out.pop("pass", None)
    out["spread"] = {k: v for k, v in spread.items() if v is not None}
    out["num_passes"] = len(passes)
    out["passes"] = passes
    return out
