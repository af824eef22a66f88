"""Suffix decoding: drafts from the request's own text and from earlier requests' outputs.

Each request's prompt and output are indexed as it goes (its *local* index); every request's output is
also indexed in one store shared by all requests (the *global* index: the outputs of running requests and
of the last ``max_cached_requests`` finished ones, the oldest evicted first). Each step both indexes
speculate (`suffix_index.py`: longest match, frequency-scored, a draft as long as the match earns) and
the chain with the higher expected acceptance is drafted. A request with a ``cache_salt`` shares a global
index with its own salt's requests only (unsalted requests share the unsalted one): one tenant's outputs
are never drafted for another. ``max_cached_requests`` bounds the finished outputs of all salts together. Repeated tool calls, multi-turn chat and edits
of code already in the prompt are where it pays. The options are vLLM's ``suffix_decoding_*`` options
(without the prefix); the index is specexec's own (see `bench/reports/2026-11-29-arctic-suffix-eval/` for
why arctic-inference's tree is not a dependency).
"""

from __future__ import annotations

from collections import deque

from ...base import options_from
from ..retrieval_drafter import RetrievalDrafter
from ..suffix_index import Speculation, SuffixIndex
from .options import SuffixOptions


class SuffixDrafter(RetrievalDrafter):
    """Suffix decoding over each request's text and a bounded store of outputs; see the module docstring."""

    def __init__(self, max_draft_len: int = 8, options: SuffixOptions | None = None, **fields) -> None:
        """``options`` (a `SuffixOptions`) or its fields as keyword arguments."""
        options = options_from(SuffixOptions, options, fields)
        super().__init__(max_draft_len, options.limits())
        self.options = options
        #: unsalted requests' outputs: of running requests, and of finished ones up to the bound
        self.shared = SuffixIndex()
        self._salted: dict[str, SuffixIndex] = {}  #: cache salt -> its requests' outputs, as ``shared``
        self._local: dict[str, SuffixIndex] = {}  #: request id -> index of its prompt and output
        #: request id -> (its salt, shared id, where its shared sequence starts in its tokens, that sequence)
        self._outputs: dict[str, tuple[str | None, int, int, list[int]]] = {}
        #: (salt, shared id) of finished requests' outputs, oldest first
        self._finished: deque[tuple[str | None, int]] = deque()

    # ---- indexing -------------------------------------------------------------------------------
    def _update(self, request) -> SuffixIndex:
        """Index the request's tokens appended since the last call; returns its local index."""
        rid, tokens = request.request_id, request.token_ids
        local = self._local.get(rid)
        if local is not None and (local.sequences[0] is not tokens or local.indexed[0] > len(tokens)):
            self._forget(rid)  # a new token list, or a shorter one: what was indexed may not hold
            local = None
        if local is None:
            local = self._local[rid] = SuffixIndex()
            local.add(tokens)  # (sequence id 0: the request's own list, read as it grows)
        else:
            local.extend(0)
        self._update_shared(request)
        return local

    def _shared_of(self, salt: str | None, create: bool = False) -> SuffixIndex | None:
        """The shared index of a cache salt's requests (None: a salt with none, unless ``create``)."""
        if salt is None:
            return self.shared
        index = self._salted.get(salt)
        if index is None and create:
            index = self._salted[salt] = SuffixIndex()
        return index

    def _update_shared(self, request) -> None:
        if self.options.max_cached_requests > 0:
            entry = self._outputs.get(request.request_id) or self._start_output(request)
            salt, shared_id, start, output = entry
            output.extend(request.token_ids[start + len(output) :])
            self._shared_of(salt).extend(shared_id)

    def _start_output(self, request) -> tuple[str | None, int, int, list[int]]:
        """The request's sequence in its salt's shared index: its output, after the last ``max_tree_depth``
        tokens of its prompt (so that how answers begin after a prompt's closing tokens is learnt too)."""
        salt = getattr(request, "cache_salt", None)
        start = max(0, request.num_prompt_tokens - self.options.max_tree_depth)
        output = list(request.token_ids[start : request.num_prompt_tokens])
        shared_id = self._shared_of(salt, create=True).add(output)
        entry = self._outputs[request.request_id] = (salt, shared_id, start, output)
        return entry

    def _remove_shared(self, salt: str | None, shared_id: int) -> None:
        """Take an output out of its salt's shared index (a salt left with none has no index)."""
        index = self._shared_of(salt)
        index.remove(shared_id)
        if salt is not None and not len(index):
            del self._salted[salt]

    def _forget(self, rid: str) -> None:
        self._local.pop(rid, None)
        entry = self._outputs.pop(rid, None)
        if entry is not None:
            self._remove_shared(entry[0], entry[1])

    # ---- drafting -------------------------------------------------------------------------------
    def speculations(self, request, num_slots: int) -> list[Speculation]:
        local = self._update(request)
        context = request.token_ids
        found = [local.speculate(context, num_slots, self.limits)]
        shared = self._shared_of(getattr(request, "cache_salt", None))
        if shared is not None and len(shared):
            found.append(shared.speculate(context, num_slots, self.limits))
        return found

    def release(self, request) -> None:
        """Forget the request's own index. A request that finished (not with an error) leaves its output
        in the shared index, where the oldest finished outputs beyond ``max_cached_requests`` are
        evicted; a preempted or failed one takes its output out."""
        super().release(request)
        rid = request.request_id
        finished = getattr(request, "finish_reason", None) not in (None, "error")
        if finished and rid in self._outputs:
            self._update_shared(request)  # its last tokens
            self._local.pop(rid, None)
            salt, shared_id, _, _ = self._outputs.pop(rid)
            self._finished.append((salt, shared_id))
            while len(self._finished) > self.options.max_cached_requests:
                self._remove_shared(*self._finished.popleft())
        else:
            self._forget(rid)

    def forget_finished_requests(self) -> None:
        while self._finished:
            self._remove_shared(*self._finished.popleft())

    # ---- introspection --------------------------------------------------------------------------
    def num_cached_requests(self) -> int:
        """Finished requests whose outputs are in the shared index."""
        return len(self._finished)
