"""Per-request grammar state for speculative decoding: mask rows for drafts, rollback on verify.

Threading contract: fill_rows() runs on the mask worker while the target forward runs; every
other method runs on the main thread, never while a MaskJob holding this object is in flight.
Drafters never touch a request's matcher: they get a `GrammarSnapshot` (a fork of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import xgrammar as xgr

from .spec import GrammarError


def grammar_valid_prefix(grammar, token_ids) -> int:
    """How many leading tokens of ``token_ids`` a grammar (anything with ``fork_for_drafting()``: a
    RequestGrammar or a GrammarSnapshot) accepts; all of them when there is no grammar."""
    if grammar is None:
        return len(token_ids)
    matcher = grammar.fork_for_drafting()
    for i, token in enumerate(token_ids):
        if matcher.is_terminated() or not matcher.accept_token(int(token)):
            return i
    return len(token_ids)


def grammar_valid_nodes(grammar, token_ids, parents) -> list[bool]:
    """Per node of a token tree (`sampling/tree_shape.py`), whether the grammar accepts the tokens of its
    path from the root (its ancestors' and its own); every node when there is no grammar."""
    if grammar is None:
        return [True] * len(token_ids)
    root = grammar.fork_for_drafting()
    matchers: list = []  # each valid node's matcher after its path (None: the node is not valid)
    for token, parent in zip(token_ids, parents):
        above = root if parent < 0 else matchers[parent]
        matcher = None
        if above is not None and not above.is_terminated():
            matcher = above.fork()
            if not matcher.accept_token(int(token)):
                matcher = None
        matchers.append(matcher)
    return [m is not None for m in matchers]


#: a row allowing more tokens than this is a choice, not a forced continuation
MAX_FORCED_CANDIDATES = 64


def forced_token(row: torch.Tensor, vocab_bytes: Sequence[bytes] | None, stop_token_ids=()) -> int | None:
    """The token a bitmask row [words] (int32) forces, else None: the only allowed token, or (given the
    vocabulary's bytes) the longest allowed token when every other allowed token is a prefix of it: the
    text is then forced at least that far, whichever way the model splits it (a stop token is forced
    only when it is the only one)."""
    words = row.numpy().view(np.uint32)
    nonzero = np.flatnonzero(words)
    if len(nonzero) == 1 and not int(words[nonzero[0]]) & (int(words[nonzero[0]]) - 1):
        return int(nonzero[0]) * 32 + int(words[nonzero[0]]).bit_length() - 1
    if vocab_bytes is None or not 0 < len(nonzero) <= MAX_FORCED_CANDIDATES:
        return None
    ids = [int(w) * 32 + b for w in nonzero for b in range(32) if int(words[w]) >> b & 1]
    if len(ids) > MAX_FORCED_CANDIDATES or any(i >= len(vocab_bytes) or i in stop_token_ids for i in ids):
        return None
    longest = max(ids, key=lambda i: len(vocab_bytes[i]))
    text = vocab_bytes[longest]
    return longest if all(vocab_bytes[i] and text.startswith(vocab_bytes[i]) for i in ids) else None


class GrammarSnapshot:
    """A drafter's view of a request's grammar at its verified state: forks of a private matcher, so
    nothing a drafter does (even after its deadline, on its own thread) reaches the request's matcher."""

    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self._matcher = matcher

    def fork_for_drafting(self) -> xgr.GrammarMatcher:
        return self._matcher.fork()

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()


@dataclass(frozen=True, slots=True)
class RowFill:
    num_rows_filled: int  # rows row0 .. row0+n-1 hold a mask; later rows were not touched
    num_drafts_accepted_by_grammar: int  # these drafts are now accepted in the matcher
    first_invalid_draft_index: int | None  # first draft the grammar rejects (its row forbids it)
    terminated: bool  # matcher terminated (stop token accepted): nothing after it is filled
    #: a tree's fill (`fill_tree_rows`): the offsets from row0 of the rows filled, not a prefix of them
    tree_rows: tuple[int, ...] | None = None
    num_invalid_nodes: int = 0  #: a tree's nodes the grammar refuses on their path (they get no row)


class RequestGrammar:
    """One xgrammar.GrammarMatcher plus the lazily accepted last verified token."""

    def __init__(
        self,
        compiled: xgr.CompiledGrammar,
        *,
        override_stop_tokens: list[int] | None = None,
        terminate_without_stop_token: bool = False,
    ) -> None:
        """``terminate_without_stop_token``: for a model without EOS, the grammar is done as soon as its
        output is complete (no stop token ends it)."""
        if not isinstance(compiled, xgr.CompiledGrammar):
            raise GrammarError(
                f"grammar compilation returned {type(compiled).__name__}, not a CompiledGrammar"
            )
        self.matcher = xgr.GrammarMatcher(
            compiled,
            override_stop_tokens=override_stop_tokens,
            terminate_without_stop_token=terminate_without_stop_token,
        )
        self.stop_token_ids = frozenset(override_stop_tokens or ())
        self.pending_token: int | None = None  # verified, emitted, not yet accepted by the matcher
        self._drafts_in_matcher = 0  # drafts accepted by the last fill_rows, awaiting verification
        self._vocab_size = compiled.tokenizer_info.vocab_size
        self._scratch: torch.Tensor | None = None  # [1, words] bitmask row for forced_tokens

    def fill_rows(self, bitmask: torch.Tensor, row0: int, draft_token_ids: Sequence[int]) -> RowFill:
        """Accept the pending token, then fill row0 (+1 row per grammar-accepted draft).

        bitmask: int32 [rows, ceil(vocab/32)] on CPU; needs rows row0 .. row0+len(drafts).
        """
        if self._drafts_in_matcher:
            raise RuntimeError("fill_rows called again before after_verification")
        if row0 < 0 or row0 + len(draft_token_ids) >= bitmask.shape[0]:
            raise ValueError(
                f"rows {row0}..{row0 + len(draft_token_ids)} do not fit a bitmask of {bitmask.shape[0]} rows"
            )
        self._accept_pending()
        m = self.matcher
        filled = accepted = 0
        invalid: int | None = None
        while not m.is_terminated():
            m.fill_next_token_bitmask(bitmask, row0 + filled)
            filled += 1
            if accepted == len(draft_token_ids):
                break
            if not m.accept_token(int(draft_token_ids[accepted])):
                invalid = accepted
                break
            accepted += 1
        self._drafts_in_matcher = accepted
        return RowFill(filled, accepted, invalid, m.is_terminated())

    def fill_tree_rows(
        self, bitmask: torch.Tensor, row0: int, draft_token_ids: Sequence[int], parents: Sequence[int]
    ) -> RowFill:
        """Accept the pending token, then fill the root's row (row0) and, for each node whose path from
        the root the grammar accepts, its row (row0 + 1 + node): the mask after that path. A node the
        grammar refuses, or one after the grammar's end, gets no row, nor do its descendants: its
        token is masked out of its parent's row, so the walk never reaches it. The matcher is left at
        the root's state (`after_tree_verification` then accepts the branch the walk took)."""
        if self._drafts_in_matcher:
            raise RuntimeError("fill_tree_rows called before after_verification")
        if (
            row0 < 0
            or row0 + len(draft_token_ids) >= bitmask.shape[0]
            or len(parents) != len(draft_token_ids)
        ):
            raise ValueError(
                f"a tree of {len(draft_token_ids)} nodes at row {row0} does not fit a bitmask of "
                f"{bitmask.shape[0]} rows"
            )
        self._accept_pending()
        m = self.matcher
        if m.is_terminated():
            return RowFill(0, 0, None, True, tree_rows=())
        m.fill_next_token_bitmask(bitmask, row0)
        rows = [0]
        paths: list[list[int] | None] = []  # per node, the path its children extend (None: they may not)
        invalid = 0
        for i, (token, parent) in enumerate(zip(draft_token_ids, parents)):
            above = [] if parent < 0 else paths[parent]
            if above is None:  # under a refused node, or after the grammar's end
                invalid += 1
                paths.append(None)
                continue
            path = [*above, int(token)]
            accepted = 0
            while accepted < len(path) and not m.is_terminated() and m.accept_token(path[accepted]):
                accepted += 1
            if accepted < len(path):
                invalid += 1
                paths.append(None)
            elif m.is_terminated():  # it ends the grammar's output: a valid node, no row, no children
                paths.append(None)
            else:
                m.fill_next_token_bitmask(bitmask, row0 + 1 + i)
                rows.append(1 + i)
                paths.append(path)
            if accepted:
                m.rollback(accepted)
        return RowFill(len(rows), 0, None, False, tree_rows=tuple(rows), num_invalid_nodes=invalid)

    def after_tree_verification(self, path_tokens: Sequence[int], emitted_token: int | None) -> int | None:
        """Accept the tokens of the tree's branch the walk took (each was drawn from a row masked at its
        place); ``emitted_token`` is accepted lazily. Returns how many of them the grammar's output ends
        with when it ended inside the branch (nothing after them belongs to the output), else None."""
        self._check_idle()
        self._accept_pending()
        for j, token in enumerate(path_tokens):
            if not self.matcher.accept_token(int(token)):
                raise GrammarError(
                    f"grammar rejected accepted draft {int(token)}; the tree's masks were not applied"
                )
            if self.matcher.is_terminated():
                return j + 1
        self.pending_token = emitted_token
        return None

    def after_verification(self, num_accepted: int, emitted_token: int | None) -> None:
        """Keep the first num_accepted drafts; emitted_token (recovered/bonus) is accepted lazily."""
        if not 0 <= num_accepted <= self._drafts_in_matcher:
            raise GrammarError(
                f"{num_accepted} drafts verified but the grammar accepted only {self._drafts_in_matcher}; "
                "the grammar mask was not applied to the verified rows"
            )
        self._accept_pending()  # a step without fill_rows: keep the previous token
        if self._drafts_in_matcher > num_accepted:
            self.matcher.rollback(self._drafts_in_matcher - num_accepted)
        self._drafts_in_matcher = 0
        self.pending_token = emitted_token

    def accept_now(self, tokens: Sequence[int]) -> None:
        """Accept tokens immediately (non-speculative path, prefill of a forced prefix, tests)."""
        self._check_idle()
        self._accept_pending()
        for i, tok in enumerate(tokens):
            if not self.matcher.accept_token(int(tok)):
                raise GrammarError(f"grammar rejected token {int(tok)} at position {i}")

    def is_terminated(self) -> bool:
        self._accept_pending()
        return self.matcher.is_terminated()

    def fork_for_drafting(self) -> xgr.GrammarMatcher:
        """Independent matcher at the current verified state, for per-step masking in a model drafter."""
        self._check_idle()
        self._accept_pending()
        return self.matcher.fork()

    def snapshot(self) -> GrammarSnapshot:
        """A drafter's private view of the current verified state."""
        return GrammarSnapshot(self.fork_for_drafting())

    def forced_tokens(self, max_tokens: int, vocab_bytes: Sequence[bytes] | None = None) -> list[int]:
        """The tokens the grammar forces next, walked on a fork: while the allowed tokens force one
        (`forced_token`: the only one, or with ``vocab_bytes`` the longest when all others are its
        prefixes), take it; at most ``max_tokens`` of them (about 0.1 ms a step). Unlike xgrammar's
        `find_jump_forward_string`, this is bounded for any grammar (an infinite derivation included)."""
        self._check_idle()
        self._accept_pending()
        matcher = self.matcher.fork()
        if self._scratch is None:
            self._scratch = xgr.allocate_token_bitmask(1, self._vocab_size)
        tokens: list[int] = []
        while len(tokens) < max_tokens and not matcher.is_terminated():
            matcher.fill_next_token_bitmask(self._scratch, 0)
            token = forced_token(self._scratch[0], vocab_bytes, self.stop_token_ids)
            if token is None or not matcher.accept_token(token):
                break
            tokens.append(token)
        return tokens

    def _accept_pending(self) -> None:
        tok, self.pending_token = self.pending_token, None
        if tok is not None and not self.matcher.accept_token(tok):
            raise GrammarError(f"grammar rejected the emitted token {tok} (was the mask applied to it?)")

    def _check_idle(self) -> None:
        if self._drafts_in_matcher:
            raise RuntimeError("unverified drafts are still in the matcher; call after_verification first")
