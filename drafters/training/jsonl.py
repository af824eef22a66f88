"""The JSONL files a training appends one record at a time (the corpus, the self-instruct pool), so that
an interrupted run loses nothing and a rerun continues it: a run killed mid-line leaves a torn last line,
which reading skips and appending cuts off first."""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger("specexec")


def open_for_append(path: Path):
    """``path`` opened to append lines, a torn last line (from a killed run) cut off first: otherwise the
    next record would be written onto it and lost with it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
    return path.open("a")


def read_jsonl(path: Path) -> list[dict]:
    """The records of ``path``, none when it does not exist (a torn last line is skipped)."""
    records = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("%s: skipping a torn line", path)
    return records
