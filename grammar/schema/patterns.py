r"""ECMA-262 patterns (``pattern``, ``patternProperties``) read with Python's ``re``, and rewritten for xgrammar.

JSON Schema searches a pattern anywhere in the string; xgrammar matches it against the whole string.
anchor_pattern() writes the one as the other; fold_lengths() moves ``minLength``/``maxLength`` into the
pattern (xgrammar ignores them next to one). Python reads most ECMA patterns alike; where it cannot
compile one, the helpers here say so (None) instead of guessing. ASCII mode throughout, as ECMA-262
reads ``\d`` and ``\w``.
"""

from __future__ import annotations

import contextlib
import re
import threading
import warnings
from collections.abc import Iterator

try:
    import re._parser as _regex_parser  # Python 3.11+
except ImportError:  # pragma: no cover
    import sre_parse as _regex_parser  # type: ignore[no-redef]

from .keywords import is_count

_WARNINGS_LOCK = threading.Lock()
_UNBOUNDED_WIDTH = getattr(_regex_parser, "MAXWIDTH", _regex_parser.MAXREPEAT)
_ONE_CHAR = r"(\[(?:\\.|[^\]\\])*\]|\\[dDwWsS]|\\[^a-zA-Z0-9]|[^\\\[\](){}|^$*+?.]|\.)"
_QUANTIFIER = r"(\+|\*|\?|\{(\d+)\}|\{(\d+),(\d*)\})"


@contextlib.contextmanager
def quiet_regex_warnings() -> Iterator[None]:
    """Silence the FutureWarnings Python's ``re`` gives patterns like ``[[`` (valid in ECMA regexes).
    ``warnings.catch_warnings`` swaps process-wide state: the lock keeps two threads from interleaving."""
    with _WARNINGS_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def search_pattern(pattern: str, text: str) -> bool | None:
    """re.search in ASCII mode (as ECMA-262 reads \\d and \\w); None when Python cannot compile it."""
    try:
        with quiet_regex_warnings():
            return re.search(pattern, text, re.ASCII) is not None
    except (re.error, TypeError):
        return None


def compile_key_patterns(patterns) -> list[tuple[re.Pattern, object]] | None:
    """patternProperties as (compiled regex, schema); None when Python cannot compile one of them.

    ASCII mode, as ECMA-262 reads \\d and \\w.
    """
    if not isinstance(patterns, dict):
        return []
    try:
        with quiet_regex_warnings():
            return [(re.compile(p, re.ASCII), s) for p, s in patterns.items()]
    except (re.error, TypeError):
        return None


def anchor_pattern(pattern: str) -> str:
    r"""The same regex under JSON Schema's search semantics, anchored at both ends with ``[\s\S]*``.

    Unchanged when already anchored at both ends, when it has anchors elsewhere, or a top-level ``|``
    next to an anchor (those cannot be rewritten this simply).
    """
    anchors, has_top_alternation = _scan(pattern)
    starts, ends = (
        pattern.startswith("^") and 0 in anchors,
        pattern.endswith("$") and len(pattern) - 1 in anchors,
    )
    if (starts and ends) or anchors - {0, len(pattern) - 1} or (has_top_alternation and (starts or ends)):
        return pattern
    any_text = r"[\s\S]*"
    if has_top_alternation:
        return f"^{any_text}(?:{pattern}){any_text}$"
    body = pattern[1 if starts else 0 : len(pattern) - 1 if ends else len(pattern)]
    if not body:
        return f"^{any_text}$"
    return f"^{'' if starts else any_text}{body}{'' if ends else any_text}$"


def fold_lengths(pattern: str, min_length, max_length) -> str | None:
    """A pattern that also enforces minLength/maxLength, or None when this module cannot write one.

    Lengths the pattern implies (by the width of its matches) leave it as it is; ``^Xq$`` with X one
    character and q a quantifier becomes ``^X{m,n}$``; an unanchored pattern whose matches all have
    length maxLength must match the whole string.
    """
    if not is_count(min_length) or not (max_length is None or is_count(max_length)):
        return None
    low, high = int(min_length), None if max_length is None else int(max_length)
    anchors, has_top_alternation = _scan(pattern)
    starts, ends = (
        pattern.startswith("^") and 0 in anchors,
        pattern.endswith("$") and len(pattern) - 1 in anchors,
    )
    if anchors - {0, len(pattern) - 1} or (has_top_alternation and (starts or ends)):
        return None
    body = pattern[1 if starts else 0 : len(pattern) - 1 if ends else len(pattern)]
    width = _width(body)
    if starts and ends:
        if (
            width is not None
            and width[0] >= low
            and (high is None or (width[1] is not None and width[1] <= high))
        ):
            return pattern
        match = re.fullmatch(_ONE_CHAR + _QUANTIFIER, body)
        if match is None:
            return None
        atom, quantifier, exact, at_least, at_most = match.groups()
        q_low, q_high = {"+": (1, None), "*": (0, None), "?": (0, 1)}.get(quantifier, (None, None))
        if q_low is None:
            q_low = int(exact if exact is not None else at_least)
            q_high = int(exact) if exact is not None else int(at_most) if at_most else None
        low = max(low, q_low)
        high = q_high if high is None else high if q_high is None else min(high, q_high)
        return (
            None if high is not None and low > high else f"^{atom}{{{low},{'' if high is None else high}}}$"
        )
    if (
        not starts
        and not ends
        and width is not None
        and high is not None
        and width == (high, high) >= (low, 0)
    ):
        return f"^(?:{pattern})$" if has_top_alternation else f"^{pattern}$"
    return None


def _width(regex: str) -> tuple[int, int | None] | None:
    """(shortest, longest or None) match length of a regex, by Python's parser; None if it cannot tell."""
    try:
        with quiet_regex_warnings():
            low, high = _regex_parser.parse(regex).getwidth()
    except Exception:  # ECMA syntax Python does not read
        return None
    return low, None if high >= _UNBOUNDED_WIDTH else high


def _scan(pattern: str) -> tuple[set[int], bool]:
    """Positions of ``^``/``$`` anchors outside character classes, and whether a ``|`` is at depth 0."""
    anchors: set[int] = set()
    depth, in_class, escaped, top_alternation = 0, False, False, False
    for i, ch in enumerate(pattern):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            top_alternation = True
        elif ch in "^$":
            anchors.add(i)
    return anchors, top_alternation
