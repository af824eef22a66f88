"""NGram (prompt-lookup) drafting: propose what followed the current suffix earlier in the text.

The pool maps a *key* (a tuple of n tokens, 1 <= n <= ``max_matching_ngram_size``) to its
*continuations*: the up-to-``max_draft_len`` tokens that followed an occurrence of the key. To draft,
the last n tokens of the request are looked up for n = ``max_matching_ngram_size`` .. 1, longest
first; the first key with a continuation gives the drafts (the oldest or the newest one, per
``is_use_oldest``). The options are TensorRT-LLM's NGram options; the differences:

* **Incremental.** Each request remembers how many of its tokens are indexed; a step indexes only
  the n-grams the new tokens complete (a few dictionary operations per token), never the whole
  sequence. The first call indexes the prompt once.
* **No truncated entries.** The pool holds only complete continuations (``max_draft_len`` tokens).
  An occurrence fewer than ``max_draft_len`` tokens before the end has a continuation that is still
  growing; instead of storing it and rewriting it every step, the lookup finds these few occurrences
  directly in the request's last tokens. So a request drafts exactly as if its whole sequence had just
  been indexed from scratch, with the oldest / newest continuation meaning that of the first / last
  occurrence of the key. A finished request's last continuations go to the shared pool as they are.
* **Bounded memory.** Each pool is an LRU of at most ``max_pool_entries`` keys (used = looked up with
  a hit or updated); a private pool is dropped when its request is released. A key with a single
  continuation stores the bare tuple, not a container.
* **One shared pool per cache salt.** A request with a ``cache_salt`` indexes into, and drafts from,
  its salt's pool only, so one tenant's text is never proposed to another (unsalted requests share the
  unsalted pool). The salted pools hold ``max_pool_entries`` keys between them; past that the pool of
  the least recently used salt is dropped.
* **Exact slot reservation.** ``num_draft_slots`` does the lookup and reserves as many slots as
  there are drafts (none without a match), so no batch budget or KV page is spent on slots that
  would stay empty; ``propose`` reuses that lookup.
* ``propose_candidates`` returns every continuation of the longest matching key (or of all matching
  keys), in preference order, for callers that choose among them (grammar-guided drafting).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ...executor.engine.speculation.tree_config import TreeShape
from ...sampling.tree_shape import trie_of_chains
from ..base import Drafter, DraftProposal, grammar_valid_prefix, options_from
from .options import NGramOptions

Key = tuple[int, ...]
Continuation = tuple[int, ...]


class NGramPool:
    """Keys to continuations, least recently used key first.

    A key's value is one continuation (a tuple) or, once a second distinct one is seen with
    ``keep_all``, a dict of them (as an ordered set) in preference order: by first occurrence when
    ``use_oldest``, by last occurrence otherwise (a continuation seen again moves to the end).
    """

    __slots__ = ("entries", "max_entries", "keep_all", "use_oldest")

    def __init__(self, max_entries: int, keep_all: bool, use_oldest: bool) -> None:
        self.entries: OrderedDict[Key, Continuation | dict[Continuation, None]] = OrderedDict()
        self.max_entries = max_entries
        self.keep_all = keep_all
        self.use_oldest = use_oldest

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        self.entries.clear()

    def add(self, key: Key, continuation: Continuation) -> None:
        entries = self.entries
        value = entries.get(key)
        if value is None:
            entries[key] = continuation
            if len(entries) > self.max_entries:
                entries.popitem(last=False)
            return
        entries.move_to_end(key)
        if type(value) is tuple:
            if value == continuation:
                return
            if not self.keep_all:
                if not self.use_oldest:
                    entries[key] = continuation  # keep only the newest
                return  # keep only the first seen
            entries[key] = {value: None, continuation: None}
        elif continuation not in value:
            value[continuation] = None
        elif not self.use_oldest:  # seen again: now the newest
            del value[continuation]
            value[continuation] = None

    def get(self, key: Key) -> Continuation | dict[Continuation, None] | None:
        """The key's continuations (marking the key used), or None."""
        value = self.entries.get(key)
        if value is not None:
            self.entries.move_to_end(key)
        return value

    def preferred(self, value: Continuation | dict[Continuation, None]) -> Continuation:
        if type(value) is tuple:
            return value
        return next(iter(value)) if self.use_oldest else next(reversed(value))

    def ordered(self, value: Continuation | dict[Continuation, None]) -> list[Continuation]:
        """All of a key's continuations, the preferred one first."""
        if type(value) is tuple:
            return [value]
        return list(value) if self.use_oldest else list(reversed(value))


class NGramDrafter(Drafter):
    """Prompt-lookup drafter with TensorRT-LLM's NGram options; see the module docstring."""

    is_deterministic = True
    returns_draft_probs = False
    runs_on_loop_thread = True  #: built in: bounded work, no thread hop (see Drafter)
    accepts_grammar_masks = True  #: guided requests get the longest grammar-valid stored candidate
    #: ``draft_tree: true``: the matching continuations as a trie (`_propose_tree`)
    default_tree = TreeShape(max_nodes=6, branching=2)  # measured: bench/reports/2026-11-29-token-trees

    def __init__(self, max_draft_len: int = 3, options: NGramOptions | None = None, **fields) -> None:
        """``options`` (an `NGramOptions`) or its fields as keyword arguments."""
        options = options_from(NGramOptions, options, fields)
        super().__init__(max_draft_len)
        self.options = options
        self._k = max_draft_len
        self._n = options.max_matching_ngram_size
        self._shared = self._new_pool() if options.is_public_pool else None  #: the unsalted requests' pool
        #: cache salt -> the shared pool of its requests, least recently used salt first
        self._salted: OrderedDict[str, NGramPool] = OrderedDict()
        self._num_salted_keys = 0  #: keys in all of ``_salted`` together
        self._private: dict[str, NGramPool] = {}  #: request id -> its pool (private mode)
        self._indexed: dict[str, int] = {}  #: request id -> tokens indexed (continuations ending there)
        self._planned: dict[str, tuple[int, Continuation]] = {}  #: request id -> (num tokens, drafts)

    def _new_pool(self) -> NGramPool:
        c = self.options
        return NGramPool(c.max_pool_entries, c.is_keep_all, c.is_use_oldest)

    # ---- indexing -------------------------------------------------------------------------------
    def _pool(self, request) -> NGramPool:
        """The request's private pool, or the shared pool of its cache salt (marked as used)."""
        if self._shared is None:
            pool = self._private.get(request.request_id)
            if pool is None:
                pool = self._private[request.request_id] = self._new_pool()
            return pool
        salt = getattr(request, "cache_salt", None)
        if salt is None:
            return self._shared
        pool = self._salted.pop(salt, None)
        if pool is None:
            pool = self._new_pool()
        self._salted[salt] = pool  # (put back last: the most recently used)
        return pool

    def _count_salted_keys(self, pool: NGramPool, num_before: int) -> None:
        """After ``pool`` went from ``num_before`` keys to its size now: keep the salted pools within
        ``max_pool_entries`` keys together, dropping the least recently used salts' pools first."""
        if pool is self._shared or self._shared is None:
            return
        self._num_salted_keys += len(pool) - num_before
        while self._num_salted_keys > self.options.max_pool_entries and len(self._salted) > 1:
            _, dropped = self._salted.popitem(last=False)  # (``pool`` was used last: never this one)
            self._num_salted_keys -= len(dropped)

    def _update(self, request) -> tuple[Sequence[int], NGramPool]:
        """Index the continuations completed since the last call; returns (tokens, pool)."""
        tokens = request.token_ids
        num_tokens = len(tokens)
        rid = request.request_id
        pool = self._pool(request)
        num_keys = len(pool)
        done = self._indexed.get(rid, 0)
        if done > num_tokens:  # the sequence got shorter: what was indexed may not hold any more
            if self._shared is None:
                pool.clear()
            done = 0
        k, n_max = self._k, self._n
        add = pool.add
        # a continuation tokens[c:e] (e = c + k) is complete once the sequence reaches e
        for e in range(max(done + 1, k + 1), num_tokens + 1):
            c = e - k
            continuation = tuple(tokens[c:e])
            for n in range(1, min(n_max, c) + 1):
                add(tuple(tokens[c - n : c]), continuation)
        self._indexed[rid] = num_tokens
        self._count_salted_keys(pool, num_keys)
        return tokens, pool

    # ---- lookup ---------------------------------------------------------------------------------
    def _recent(self, tokens: Sequence[int], n: int) -> list[int]:
        """Starts c of the continuations after recent occurrences of the last n tokens that are
        still shorter than max_draft_len (so not in the pool), in order."""
        num_tokens = len(tokens)
        suffix = tokens[num_tokens - n :]
        return [c for c in range(max(n, num_tokens - self._k + 1), num_tokens) if tokens[c - n : c] == suffix]

    def _best(self, tokens: Sequence[int], pool: NGramPool) -> Continuation:
        return self._best_match(tokens, pool)[1]

    def _best_match(self, tokens: Sequence[int], pool: NGramPool) -> tuple[int, Continuation]:
        """(key size, continuation) of the preferred match, longest key first; (0, ()) for none."""
        num_tokens = len(tokens)
        use_oldest = self.options.is_use_oldest
        for n in range(min(self._n, num_tokens - 1), 0, -1):
            value = pool.get(tuple(tokens[num_tokens - n :]))
            if use_oldest and value is not None:  # stored ones are older than the recent ones
                return n, pool.preferred(value)
            recent = self._recent(tokens, n)
            if recent:
                return n, tuple(tokens[recent[0] if use_oldest else recent[-1] :])
            if value is not None:
                return n, pool.preferred(value)
        return 0, ()

    def _candidates(self, tokens: Sequence[int], pool: NGramPool, n: int) -> list[Continuation]:
        value = pool.get(tuple(tokens[len(tokens) - n :]))
        stored = pool.ordered(value) if value is not None else []
        recent = [tuple(tokens[c:]) for c in self._recent(tokens, n)]
        ordered = stored + recent if self.options.is_use_oldest else recent[::-1] + stored
        if not self.options.is_keep_all:
            ordered = ordered[:1]
        return list(dict.fromkeys(ordered))

    # ---- the Drafter interface ------------------------------------------------------------------
    def num_draft_slots(self, request) -> int:
        """Exactly as many slots as there are drafts: 0 when nothing matches (with ``draft_tree``: the
        depth of the deepest candidate)."""
        if self.draft_tree is not None and self.grammar_of(request) is None:
            candidates = self.propose_candidates(request, all_keys=True)
            self._planned[request.request_id] = (len(request.token_ids), tuple(candidates))
            return max(map(len, candidates), default=0)
        tokens, pool = self._update(request)
        drafts = self._best(tokens, pool) if self.grammar_of(request) is None else self._best_valid(request)
        self._planned[request.request_id] = (len(tokens), drafts)
        return len(drafts)

    def _best_valid(self, request) -> Continuation:
        """Guided requests: the longest grammar-valid prefix among all stored candidates (longest key
        first, so ties keep the usual preference), each cut at its first token the grammar rejects."""
        best: Continuation = ()
        for candidate in self.propose_candidates(request, all_keys=True):
            valid = candidate[: grammar_valid_prefix(self.grammar_of(request), candidate)]
            if len(valid) > len(best):
                best = valid
        return best

    def prepare_draft_tokens(self, scheduled_requests: list, resources) -> dict[str, DraftProposal]:
        if self.draft_tree is None:
            return super().prepare_draft_tokens(scheduled_requests, resources)
        return {s.request.request_id: self._propose_tree(s) for s in scheduled_requests}

    def _propose_tree(self, s) -> DraftProposal:
        """With ``draft_tree``: the matching continuations as one trie (longest key first, the preferred
        one the first branch), within the step's nodes, depth and the shape's branching."""
        request = s.request
        if self.grammar_of(request) is not None:  # guided: its chain (a tree would be cut to one)
            return self.propose(request, s.num_draft_slots)
        planned = self._planned.pop(request.request_id, None)
        if planned is not None and planned[0] == len(request.token_ids):
            candidates = planned[1]
        else:
            candidates = self.propose_candidates(request, all_keys=True)
        depth = s.max_draft_depth or s.num_draft_slots
        tokens, parents = trie_of_chains(candidates, s.num_draft_slots, depth, self.draft_tree.branching)
        return DraftProposal(tokens, parents=parents)

    def propose(self, request, num_slots: int, resources=None) -> DraftProposal:
        planned = self._planned.pop(request.request_id, None)
        if planned is not None and planned[0] == len(request.token_ids) and self.draft_tree is None:
            drafts = planned[1]
        elif self.grammar_of(request) is not None:
            drafts = self._best_valid(request)
        else:
            tokens, pool = self._update(request)
            drafts = self._best(tokens, pool)
        return DraftProposal(list(drafts[: max(0, num_slots)]))

    def propose_candidates(self, request, all_keys: bool = False) -> list[Continuation]:
        """Every continuation of the longest matching key, the one `propose` would pick first
        (just that one without ``is_keep_all``). With ``all_keys``, those of the shorter matching
        keys follow, longest key first, without repeats."""
        tokens, pool = self._update(request)
        found: dict[Continuation, None] = {}
        for n in range(min(self._n, len(tokens) - 1), 0, -1):
            candidates = self._candidates(tokens, pool, n)
            if candidates and not all_keys:
                return candidates
            found.update(dict.fromkeys(candidates))
        return list(found)

    def lookup(self, request) -> tuple[int, Continuation]:
        """(key size, continuation) of what `propose` would draft for an unguided request, the key
        size telling how long a suffix matched (0 and () when nothing did): for callers that weigh
        the lookup against drafts of their own."""
        return self._best_match(*self._update(request))

    def on_verified(self, request, num_accepted: int) -> None:
        """Nothing to do: the next lookup indexes the tokens appended meanwhile."""

    def release(self, request) -> None:
        """Forget the request; its private pool goes. A finished request's last continuations (shorter
        than max_draft_len, never completed) are added to the shared pool."""
        rid = request.request_id
        self._planned.pop(rid, None)
        if self._shared is None:
            self._private.pop(rid, None)
        elif getattr(request, "finish_reason", None) not in (None, "error"):
            tokens, pool = self._update(request)
            num_tokens, k, num_keys = len(tokens), self._k, len(pool)
            for c in range(max(1, num_tokens - k + 1), num_tokens):
                continuation = tuple(tokens[c:])
                for n in range(1, min(self._n, c) + 1):
                    pool.add(tuple(tokens[c - n : c]), continuation)
            self._count_salted_keys(pool, num_keys)
        self._indexed.pop(rid, None)

    # ---- introspection --------------------------------------------------------------------------
    def pool_size(self, request=None) -> int:
        """Keys in the shared pool the request reads (its cache salt's; the unsalted one without a
        request), or in the request's private pool (0 if it has none)."""
        if self._shared is not None:
            salt = getattr(request, "cache_salt", None)
            pool = self._shared if salt is None else self._salted.get(salt)
        else:
            pool = self._private.get(request.request_id) if request is not None else None
        return len(pool) if pool is not None else 0
