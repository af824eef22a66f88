"""Text refused before it reaches the tokenizer: a prompt longer than the context could hold at the
vocabulary's longest token (tokenizing a 10 MB message took 7 s to find it too long, the event loop
blocked meanwhile), and a ``user`` longer than `MAX_USER_CHARS` (a stored response holds it: 12 with an
8 MiB ``user`` took 334 MiB)."""

from __future__ import annotations

from typing import Any

from ...executor.engine.request import Request
from ..bad_request import BadRequest

MAX_USER_CHARS = 256  #: ``user`` (an end-user id) at most
MIN_CHARS_PER_TOKEN = 16  #: the per-token bound's floor (for a tokenizer that lists no vocabulary: 64)


def max_chars_per_token(tokenizer: Any) -> int:
    """A generous bound on the characters one token covers: twice the vocabulary's longest entry, as
    written in the vocabulary (a byte-level BPE entry has a character per byte, a SentencePiece one its
    text with ``▁`` for a space), at least `MIN_CHARS_PER_TOKEN`. A prompt of more characters than this
    times the context cannot fit whatever it tokenizes to (SmolLM2's longest entry, a newline and 80
    spaces, has 81)."""
    try:
        longest = max(map(len, tokenizer.get_vocab()))
    except (AttributeError, TypeError, ValueError):
        return 4 * MIN_CHARS_PER_TOKEN
    return max(MIN_CHARS_PER_TOKEN, 2 * longest)


def check_prompt_size(requests: list[Request], max_chars: int, param: str) -> None:
    """A 400 naming ``param`` when one request's prompt (its text, its messages' strings, its tools'
    definitions) holds more than ``max_chars`` characters."""
    for request in requests:
        num_chars = _num_chars(request.prompt) + _num_chars(request.tools)
        if num_chars > max_chars:
            raise BadRequest(
                f"the prompt has {num_chars} characters, more than the context could hold "
                f"({max_chars}: the model's context times the longest token's characters, twice)",
                param,
            )


def check_user(user: Any) -> None:
    if user is not None and (not isinstance(user, str) or len(user) > MAX_USER_CHARS):
        raise BadRequest(f"user must be a string of at most {MAX_USER_CHARS} characters", "user")


def _num_chars(value: Any) -> int:
    """The characters of every string in ``value`` (text, or lists and objects of it; ids count 0)."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(x for x in item if not isinstance(x, int))
    return total
