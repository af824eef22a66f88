"""Per-request grammar state for speculative decoding: mask rows for drafts, rollback on verify.

Threading contract: fill_rows() runs on the mask worker while the target forward runs; every
other method runs on the main thread, never while a MaskJob holding this object is in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import xgrammar as xgr

from .spec import GrammarError


@dataclass(frozen=True, slots=True)
class RowFill:
    num_rows_filled: int  # rows row0 .. row0+n-1 hold a mask; later rows were not touched
    num_drafts_accepted_by_grammar: int  # these drafts are now accepted in the matcher
    first_invalid_draft_index: int | None  # first draft the grammar rejects (its row forbids it)
    terminated: bool  # matcher terminated (stop token accepted): nothing after it is filled


class RequestGrammar:
    """One xgrammar.GrammarMatcher plus the lazily accepted last verified token."""

    def __init__(
        self, compiled: xgr.CompiledGrammar, *, override_stop_tokens: list[int] | None = None
    ) -> None:
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=override_stop_tokens)
        self.pending_token: int | None = None  # verified, emitted, not yet accepted by the matcher
        self._drafts_in_matcher = 0  # drafts accepted by the last fill_rows, awaiting verification

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

    def jump_forward_string(self) -> str:
        """Text the grammar forces next ("" if none or terminated)."""
        self._check_idle()
        self._accept_pending()
        return "" if self.matcher.is_terminated() else self.matcher.find_jump_forward_string()

    def _accept_pending(self) -> None:
        tok, self.pending_token = self.pending_token, None
        if tok is not None and not self.matcher.accept_token(tok):
            raise GrammarError(f"grammar rejected the emitted token {tok} (was the mask applied to it?)")

    def _check_idle(self) -> None:
        if self._drafts_in_matcher:
            raise RuntimeError("unverified drafts are still in the matcher; call after_verification first")
