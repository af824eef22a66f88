"""The EAGLE-3 head's paged KV cache, per request: which positions hold *real* entries (computed from
the target's features), which verified features wait to be fed, and the pages drafts borrow.

Positions ``[0, num_real)`` hold real entries; the pending features cover ``[pending_start,
pending_end)``; draft entries lie past ``num_real`` until the next catch-up rewinds them away. A head with
a ``sliding_window`` holds, without computing, the slots no query of a catch-up attends (see the
drafter's module docstring for why that is exact).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...executor.engine.block_manager import BlockManager
from ...executor.model.paged_attention import paged_attention


@dataclass(slots=True)
class HeadState:
    num_real: int = 0  #: head cache positions holding entries computed from the target's features
    pending_start: int = 0  #: position of pending[0]
    pending: torch.Tensor | None = None  # [n, 3 * target_hidden] features of positions not yet fed

    @property
    def pending_end(self) -> int:
        """One past the last position the pending features cover."""
        return self.pending_start + (len(self.pending) if self.pending is not None else 0)


class PagedHeadAttention:
    """Routes the head's attention through paged attention, on layer 0 of its cache."""

    def __init__(self, metadata, sliding_window: int | None) -> None:
        self.metadata = metadata
        self.sliding_window = sliding_window

    def __call__(self, q, k, v):  # [T, heads|kv_heads, head_dim] -> [T, heads, head_dim]
        scaling = q.shape[-1] ** -0.5
        return paged_attention(0, q, k, v, self.metadata, scaling, self.sliding_window)


class HeadCache:
    """Each request's `HeadState` and its pages in the head's own block manager."""

    def __init__(self, block_manager: BlockManager, max_draft_len: int, sliding_window: int | None) -> None:
        self.block_manager = block_manager
        self.max_draft_len = max_draft_len
        self.sliding_window = sliding_window
        self.states: dict[str, HeadState] = {}

    def take_features(self, request) -> bool:
        """Move the request's newly verified target features into the head's pending rows; True when
        pending rows cover every verified position the head has not fed yet (it can catch up and draft)."""
        state = self.states.setdefault(request.request_id, HeadState())
        for start, rows in request.target_hidden:
            if state.pending is None or start < state.pending_start:
                state.pending_start, state.pending = start, rows
            elif start <= state.pending_end:  # rows from `start` on are replaced (a recompute)
                state.pending = torch.cat([state.pending[: start - state.pending_start], rows])
            else:  # a gap the head cannot bridge: draft again once the request is recomputed
                state.pending = None
            state.num_real = min(state.num_real, start)  # entries from `start` on are recomputed
        request.target_hidden.clear()
        if state.pending is None:
            return False
        return state.pending_start <= state.num_real < state.pending_end == request.num_tokens - 1

    def skip_outside_window(self, requests) -> None:
        """Hold, without computing, the slots of pending positions that no query of this step attends:
        those more than ``sliding_window`` before the catch-up's end."""
        if self.sliding_window is None:
            return
        for r in requests:
            st = self.states[r.request_id]
            skip = st.pending_end - self.sliding_window - st.num_real
            if skip > 0:
                self.grow(r, skip)
                st.num_real += skip

    def rewind_to_real(self, requests) -> None:
        """Drop last step's draft entries (and anything past a recompute point) from the head's cache."""
        for r in requests:
            rid, bm = r.request_id, self.block_manager
            if rid in bm.block_tables:
                extra = bm.num_slots[rid] - self.states[rid].num_real
                if extra > 0:
                    bm.rewind(rid, extra)

    def blocks_needed(self, request, num_draft_slots: int | None = None) -> int:
        """New pages the catch-up and the drafts of this step take at most (``num_draft_slots`` past the
        real positions: a dynamic tree's fed nodes; None: a chain's ``max_draft_len``)."""
        st, bm = self.states[request.request_id], self.block_manager
        num_slots = st.pending_end + (num_draft_slots or self.max_draft_len)
        held = len(bm.block_tables.get(request.request_id, ()))
        return max(0, -(-num_slots // bm.block_size) - held)

    def grow(self, request, num_tokens: int) -> None:
        rid, bm = request.request_id, self.block_manager
        if rid not in bm.block_tables:
            bm.allocate(rid, num_tokens)
        else:
            bm.append(rid, num_tokens)

    def reserve(self, requests) -> bool:
        """One more slot each for a drafting step; False (stop drafting) when the head's pool is full."""
        bm = self.block_manager
        if not all(bm.can_append(r.request_id, 1) for r in requests):
            return False
        for r in requests:
            bm.append(r.request_id, 1)
        return True

    def reserve_up_to(self, requests, num_slots: dict[str, int]) -> bool:
        """Slots up to ``num_slots[id]`` each (a dynamic tree's fed nodes past the real positions);
        False, reserving none, when the head's pool cannot hold them all."""
        bm = self.block_manager
        more = {r.request_id: num_slots[r.request_id] - bm.num_slots[r.request_id] for r in requests}
        if not all(n <= 0 or bm.can_append(rid, n) for rid, n in more.items()):
            return False
        for rid, n in more.items():
            if n > 0:
                bm.append(rid, n)
        return True

    def release(self, request_id: str) -> None:
        self.states.pop(request_id, None)
        self.block_manager.free(request_id)
