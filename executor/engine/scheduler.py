"""Continuous batching: which requests run in the next forward, and with how many tokens.

Each step every running request gets its uncomputed tokens (1 when decoding, plus its reserved draft
slots; a chunk of its prompt when prefilling), in admission order, under the token budget
``max_num_tokens``; then waiting requests are admitted while the budget, ``max_batch_size`` and the
KV pool allow. A long prompt is prefilled in chunks across steps. When pages run out, draft slots go
first, then the newest running request is preempted: its pages are freed and it waits to be recomputed.
With prefix caching a request is admitted after the cached pages of its prefix (`block_manager.py`),
pages registered by requests of its own ``cache_salt`` only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .block_manager import BlockManager
from .request import RequestState, RequestStatus


@dataclass(slots=True)
class ScheduledRequest:
    """A request's share of one step: its new tokens, its draft slots and the drafts that fill them.
    It lives for one step; nothing of the step's drafting stays on the request."""

    request: RequestState
    num_new_tokens: int  #: uncomputed tokens fed this step (not counting drafts)
    num_draft_slots: int  #: draft slots reserved this step (the drafter may fill fewer)
    draft_token_ids: list[int] = field(default_factory=list)  #: this step's drafts (<= num_draft_slots)
    draft_probs: torch.Tensor | None = None  # [num_drafts, vocab] the drafter's q, if it gave one
    #: a token tree's parents (`sampling/tree_shape.py`); None: the drafts are a chain
    draft_parents: list[int] | None = None
    max_draft_depth: int = 0  #: with ``draft_tree``: the deepest a tree may go this step (0: chains)
    tree_depth: int = 0  #: the depth of the tree drafted (0: a chain), what the draft-length policy sees
    #: the tree's accepted nodes once verified (their K/V still at the nodes' slots until moved)
    accepted_path: list[int] | None = None
    #: a verified tree's first branch: (its length, how many of its nodes were accepted)
    first_branch: tuple[int, int] = (0, 0)

    @property
    def completes_sequence(self) -> bool:
        """True when this step reaches the end of the known tokens, so it yields new tokens."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_batch_size: int, max_num_tokens: int) -> None:
        self.block_manager = block_manager
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []  # admission order: the newest is last
        #: pages kept free at admission so running requests can grow without preempting at once
        self.watermark_blocks = max(1, block_manager.num_blocks // 100)
        self._has_preempted = False
        self._draft_slots: Mapping[RequestState, int] = {}
        #: with the block manager's prefix caching: new requests start from the cached pages of their
        #: prefix (off where every position's hidden states are needed: EAGLE-3, capture_hidden_layers)
        self.reuses_prefixes = block_manager.enable_prefix_caching

    def add(self, request: RequestState) -> None:
        self.waiting.append(request)

    def has_request(self, request_id: str) -> bool:
        return any(r.request_id == request_id for r in (*self.running, *self.waiting))

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, draft_slots: Mapping[RequestState, int] | None = None) -> list[ScheduledRequest]:
        """This step's batch; ``draft_slots`` are the slots wanted per decoding request (drafter and
        grammar-forced tokens), given where they fit."""
        self._draft_slots = draft_slots or {}
        budget = self.max_num_tokens
        scheduled: list[ScheduledRequest] = []
        self._has_preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            item = self._schedule_running(self.running[i], budget, scheduled)
            if item is None:  # it was preempted itself: it was the newest, nothing runs after it
                break
            scheduled.append(item)
            budget -= item.num_new_tokens + item.num_draft_slots
            i += 1
        if not self._has_preempted:  # pages are short: admit nobody this step
            scheduled += self._admit_waiting(budget)
        return scheduled

    def _schedule_running(
        self, request: RequestState, budget: int, scheduled: list[ScheduledRequest]
    ) -> ScheduledRequest | None:
        num_new = min(request.num_uncomputed_tokens, budget)
        is_decoding = num_new == request.num_uncomputed_tokens == 1
        num_drafts = min(self._draft_slots.get(request, 0), budget - num_new) if is_decoding else 0
        bm = self.block_manager
        while not bm.can_append(request.request_id, num_new + num_drafts):
            if num_drafts:  # drafts are optional: this request's go first,
                num_drafts = 0
                continue
            drafted = next((s for s in reversed(scheduled) if s.num_draft_slots), None)
            if drafted is not None:  # then those of requests scheduled before it,
                bm.rewind(drafted.request.request_id, drafted.num_draft_slots)
                drafted.num_draft_slots = 0
                continue
            victim = self.running[-1]
            self.preempt(victim)
            if victim is request:
                return None
        bm.append(request.request_id, num_new + num_drafts)
        return ScheduledRequest(request, num_new, num_drafts)

    def _admit_waiting(self, budget: int) -> list[ScheduledRequest]:
        admitted = []
        bm = self.block_manager
        for request in list(self.waiting):  # in order; requests still compiling a grammar wait
            if budget <= 0 or len(self.running) >= self.max_batch_size:
                break
            if not request.is_ready:
                continue
            cached = self._cached_prefix(request)
            if self._next_page_in_flight(request, len(cached[0])):
                continue  # a request ahead computes it: share it next step (n samples of one prompt)
            num_cached = len(cached[0]) * bm.block_size
            num_new = min(request.num_uncomputed_tokens - num_cached, budget)
            blocks = -(-num_new // bm.block_size)
            if blocks + self.watermark_blocks > bm.num_free_blocks and self.running:
                break
            if not bm.can_allocate(num_new, cached):
                break
            self.waiting.remove(request)
            bm.allocate(request.request_id, num_new, cached)
            request.num_computed_tokens = num_cached
            if request.metrics.num_preemptions == 0:
                request.metrics.num_cached_tokens = num_cached
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            admitted.append(ScheduledRequest(request, num_new, 0))
            budget -= num_new
        return admitted

    def _cached_prefix(self, request: RequestState) -> tuple[list[int], list[int]]:
        """The cached pages a waiting request starts from (none when it scores its prompt: every
        prompt row is needed)."""
        if not self.reuses_prefixes or request.num_computed_tokens or request.prompt_logprobs:
            return [], []
        return self.block_manager.cached_prefix(request.token_ids, request.num_tokens - 1, request.cache_salt)

    def _next_page_in_flight(self, request: RequestState, num_cached_pages: int) -> bool:
        """Whether a running request (admitted earlier, this step included) is computing the waiting
        request's next full page of prompt, so that waiting a step lets it share that page instead of
        computing it again."""
        if not self.reuses_prefixes or request.num_computed_tokens or request.prompt_logprobs:
            return False
        bs = self.block_manager.block_size
        end = (num_cached_pages + 1) * bs
        if end > request.num_tokens - 1:  # no full page left to share (its last token is computed)
            return False
        tokens = request.token_ids
        page = tokens[end - bs : end]
        return any(
            other.num_computed_tokens < end
            and other.cache_salt == request.cache_salt  # (another salt's page is never shared)
            and other.token_ids[end - bs : end] == page  # (cheap first: most differ here)
            and other.token_ids[: end - bs] == tokens[: end - bs]
            for other in self.running
        )

    def preempt(self, request: RequestState) -> None:
        """Take a running request's pages back; it waits at the front to be recomputed."""
        self.running.remove(request)
        self.block_manager.free(request.request_id)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.metrics.num_preemptions += 1
        self._has_preempted = True
        self.waiting.appendleft(request)

    def finish(self, request: RequestState) -> None:
        """Remove a finished request and free its pages."""
        if request in self.running:
            self.running.remove(request)
            self.block_manager.free(request.request_id)  # only a running request holds pages
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
