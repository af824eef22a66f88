"""One request's Jacobi window and n-gram pool (lookahead decoding, arXiv 2402.02057).

The *window* holds guesses for the next ``window_size`` positions after the root (the token each step
feeds). It is verified as one branch of the step's drafts, so the target's greedy token at each of its
rows comes back: the next Jacobi iterate, a guess for every position one further given the guesses
before it. The window then moves on past the tokens the step emitted and takes the new iterate.

The *pool* maps a token to n-grams that followed it (``ngram_size`` tokens with the key, the most recent
``pool_size`` kept per key). It learns from the window's trajectory as lookahead decoding does: for each
position q, the guesses for q, q + 1, ... from successive iterations (one position further each
iteration, the diagonal of the 2D window) and the newest iterate's token after them; and from the
request's own text (prompt and output) as it grows.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence


class NGramPool:
    """First token -> its n-grams' continuations, most recent last, at most ``size`` per token."""

    __slots__ = ("entries", "size")

    def __init__(self, size: int) -> None:
        self.entries: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        self.size = size

    def add(self, ngram: Sequence[int]) -> None:
        key, rest = ngram[0], tuple(ngram[1:])
        kept = self.entries.setdefault(key, OrderedDict())
        kept.pop(rest, None)
        kept[rest] = None
        if len(kept) > self.size:
            kept.popitem(last=False)

    def continuations(self, token: int, limit: int) -> list[tuple[int, ...]]:
        """The ``limit`` most recent continuations after ``token``, the newest first."""
        kept = self.entries.get(token)
        return list(reversed(kept))[:limit] if kept else []


class JacobiState:
    """A request's window, the last iterations' guesses by position, and its pool."""

    def __init__(self, window_size: int, ngram_size: int, pool_size: int) -> None:
        self.window_size = window_size
        self.ngram_size = ngram_size
        self.pool = NGramPool(pool_size)
        self.window: list[int] = []  #: guesses for positions root + 1, root + 2, ...
        self.window_start = 0  #: the position the window's first guess is for
        #: the last ngram_size - 1 iterations' guesses, position -> token (oldest first)
        self.history: deque[dict[int, int]] = deque(maxlen=max(1, ngram_size - 1))
        self.num_indexed = 0  #: tokens of the request's text whose n-grams are in the pool

    def index_text(self, tokens: Sequence[int]) -> None:
        """The n-grams the text's new tokens complete."""
        n = self.ngram_size
        for end in range(max(self.num_indexed, n), len(tokens) + 1):
            self.pool.add(tokens[end - n : end])
        self.num_indexed = len(tokens)

    def window_for(self, root_pos: int, tokens: Sequence[int], depth: int) -> list[int]:
        """The guesses for the ``depth`` positions after ``root_pos``: the window where it reaches them,
        else the pool's continuation of the last known token, else the text's last tokens again."""
        offset = root_pos + 1 - self.window_start
        guesses = list(self.window[offset:]) if 0 <= offset < len(self.window) else []
        last = guesses[-1] if guesses else tokens[-1]
        while len(guesses) < depth:
            more = self.pool.continuations(last, 1)
            step = list(more[0]) if more else list(tokens[-(depth - len(guesses)) :])
            guesses.extend(step[: depth - len(guesses)])
            last = guesses[-1]
        self.window, self.window_start = guesses[:depth], root_pos + 1
        return self.window

    def take_iterate(self, root_pos: int, outputs: list[int]) -> None:
        """The target's greedy tokens at the root's row and the window's rows: ``outputs[k]`` is the
        guess for position root + 1 + k given the window before it. Learn the diagonal n-grams, then
        make it the window."""
        window = {self.window_start + i: t for i, t in enumerate(self.window)}
        self.history.append(window)
        iterate = {root_pos + 1 + k: t for k, t in enumerate(outputs)}
        n = self.ngram_size
        if len(self.history) == self.history.maxlen:
            levels = list(self.history)  # n - 1 iterations, oldest first
            for q in range(min(levels[0], default=0), max(levels[0], default=-1) + 1):
                gram = [levels[i].get(q + i) for i in range(n - 1)] + [iterate.get(q + n - 1)]
                if all(t is not None for t in gram):
                    self.pool.add(gram)
        self.window, self.window_start = list(outputs), root_pos + 1
