"""The benchmark's outputs: a terminal table with its legend, and a JSON file (the plot is in plot.py)."""

from __future__ import annotations

import json
from pathlib import Path


def _fmt(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _measured(row: dict, key: str, spec: str = ".1f", unit: str = "") -> str:
    """A measured figure; with --repeats its median, then its spread over the passes: ``24.1 (22.0-25.3)``."""
    value = row["speedup"].get(key.removeprefix("speedup.")) if key.startswith("speedup.") else row.get(key)
    cell = _fmt(value, spec) + (unit if value is not None else "")
    low_high = row.get("spread", {}).get(key)
    if value is None or not low_high or row.get("num_passes", 1) < 2:
        return cell
    return f"{cell} ({format(low_high[0], spec)}-{format(low_high[1], spec)})"


COLUMNS = (
    "name",
    "c",
    "n",
    "tok/s",
    "tok/s/user",
    "ttft p50 ms",
    "ttft 2+ ms",
    "tpot p50 ms",
    "acc.len",
    "drafted",
    "draft%",
    "stops",
    "valid",
    "cached%",
    "vs none",
    "vs hf",
)


def format_table(rows: list[dict], guided: bool = False) -> str:
    """One line per row; ``valid`` (the schema-valid share) only for a ``--guided`` run, where it means
    something (unguided outputs are not asked to follow the prompts' schemas); ``ttft 2+`` only for
    conversations."""
    later = any(row.get("ttft_later_turns_ms_p50") is not None for row in rows)
    cells = [
        [
            row["name"],
            str(row["concurrency"]),
            str(row["num_requests"]) + (f" ({row['num_failed']} failed)" if row.get("num_failed") else ""),
            _measured(row, "output_tokens_per_s"),
            _measured(row, "per_user_tokens_per_s"),
            _measured(row, "ttft_ms_p50", ".0f"),
            *([_measured(row, "ttft_later_turns_ms_p50", ".0f")] if later else []),
            _measured(row, "tpot_ms_p50"),
            _fmt(row["mean_acceptance_length"], ".2f"),
            _fmt(row.get("drafted_share"), ".0%"),
            _fmt(row.get("drafting_share") if row.get("mean_acceptance_length") else None, ".0%"),
            _fmt(row.get("num_stop_tokens"), "d"),
            _fmt(row["schema_valid_rate"] if guided else None, ".0%"),
            _fmt(row.get("cached_share"), ".0%"),
            _measured(row, "speedup.none", ".2f", "x"),
            _measured(row, "speedup.hf", ".2f", "x"),
        ]
        for row in rows
    ]
    header = [c for c in COLUMNS if later or c != "ttft 2+ ms"]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for r in cells:
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)


LEGEND = (
    "n           requests a pass; (k failed): requests that ended in an error, over all passes (each one's\n"
    "            error is in the JSON's requests); the row's figures count what the others made\n"
    "tok/s       all requests' output tokens / wall time, first sent to last done (prefill and gaps included)\n"
    "tok/s/user  mean over requests of 1 / TPOT: decoding only, no prefill, so at c=1 it is above tok/s\n"
    "ttft p50    median time from a request's sending to its first output token (queueing, prefill); every\n"
    "            engine is sent a request when one of its c slots frees, and the clock starts then\n"
    "ttft 2+     (conversations) the same over turns 2 and later, whose prompts hold the earlier turns\n"
    "tpot p50    median over requests of (finish - first token) / (output tokens - 1)\n"
    "acc.len     (decode steps + accepted drafts) / decode steps: tokens per target forward\n"
    "drafted     share of decode steps that verified at least one draft (what the draft-length policy did)\n"
    "draft%      drafting time / (drafting + target-forward time)\n"
    "stops       tokens of the run's one stop set sampled (over all passes); 0 with --ignore-eos, where none\n"
    "            can be sampled; - where the engine does not say which tokens it sampled\n"
    "valid       share of outputs valid against their prompt's schema (--guided only, else -)\n"
    "cached%     share of prompt tokens taken from the prefix cache instead of computed\n"
    "vs none     tok/s over specexec's without drafts at the same concurrency\n"
    "vs hf       tok/s over HF generate's (c=1; hf-guided with --guided) or generate_batch's (c>1)\n"
    "with --repeats N: each timed cell is the median of N interleaved passes, (min-max) after it\n"
    "timing: hf c=1 rows with a generate streamer (hf-assisted's first chunk brings its first accepted\n"
    "        drafts along); hf-batch from transformers' continuous-batching timestamps; server rows at the client"
)


def caching_ratios(rows: list[dict]) -> list[str]:
    """One line per ``<name>+cache`` row with its ``<name>`` twin at the same concurrency: prefix
    caching's TTFT (of later turns, in conversations) and tok/s against none."""
    by_key = {(r["name"], r["concurrency"]): r for r in rows}
    lines = []
    for row in rows:
        base = by_key.get((row["name"].removesuffix("+cache"), row["concurrency"]))
        if not row["name"].endswith("+cache") or base is None:
            continue
        key = "ttft_later_turns_ms_p50" if row.get("ttft_later_turns_ms_p50") is not None else "ttft_ms_p50"
        ttft = row[key] / base[key] if row.get(key) and base.get(key) else None
        rate = (
            row["output_tokens_per_s"] / base["output_tokens_per_s"] if base["output_tokens_per_s"] else None
        )
        turns = "TTFT of turns 2+" if key == "ttft_later_turns_ms_p50" else "TTFT"
        lines.append(
            f"prefix caching, {base['name']} c={row['concurrency']}: {turns} {_fmt(ttft, '.2f')}x, "
            f"tok/s {_fmt(rate, '.2f')}x, cached {_fmt(row.get('cached_share'), '.0%')} of prompt tokens"
        )
    return lines


def add_speedups(rows: list[dict], baselines: dict[int, dict[str, str]]) -> None:
    """Fill each row's ``speedup``: its tokens/s over each baseline's at the same concurrency.
    ``baselines[c]`` maps a baseline label ("none", "hf") to the row name that plays it at c."""
    by_key = {(r["name"], r["concurrency"]): r for r in rows}
    for row in rows:
        for label, name in baselines.get(row["concurrency"], {}).items():
            base = by_key.get((name, row["concurrency"]))
            if base and base["output_tokens_per_s"] and row["output_tokens_per_s"]:
                row["speedup"][label] = row["output_tokens_per_s"] / base["output_tokens_per_s"]


def write_json(path: str | Path, rows: list[dict], meta: dict) -> None:
    Path(path).write_text(json.dumps({**meta, "results": rows}, indent=1))
