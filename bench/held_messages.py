"""Library messages held while the benchmark's progress bar draws, which they would break, and printed
once each after it.

Two kinds arrive during the HF rows: transformers' log records (its assisted generation calls the
assistant's ``generate`` with a ``generation_config`` and ``max_new_tokens`` together, which transformers
5 itself reports as deprecated) and Python ``warnings`` (torch's, transformers' own ``FutureWarning``s).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator


class _Hold(logging.Handler):
    def __init__(self, messages: dict[str, None]) -> None:
        super().__init__()
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.setdefault(f"transformers: {record.getMessage()}")


@contextlib.contextmanager
def library_messages_after_the_bar() -> Iterator[None]:
    """Inside: transformers' log records and Python warnings are collected (the warning filters in force
    still decide which warnings exist). After: each distinct one printed once to stderr, in order."""
    messages: dict[str, None] = {}
    hf_logger = logging.getLogger("transformers")
    saved = hf_logger.handlers[:], hf_logger.propagate
    hf_logger.handlers[:], hf_logger.propagate = [_Hold(messages)], False
    try:
        with warnings.catch_warnings(record=True) as caught:
            try:
                yield
            finally:
                for w in caught:
                    messages.setdefault(f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})")
    finally:
        hf_logger.handlers[:], hf_logger.propagate = saved
        for message in messages:
            print(f"[{message}]", file=sys.stderr)
