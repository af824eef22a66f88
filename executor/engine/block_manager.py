"""Hands out fixed-size KV-cache pages ("blocks") to requests, and with prefix caching shares the full
pages of a common prefix between them.

A request's block table lists its pages in order; token position ``p`` lives in slot
``block_table[p // block_size] * block_size + p % block_size`` of the flat KV pool.
Methods come in predicate/action pairs (``can_allocate``/``allocate``, ``can_append``/``append``).

A request that grows takes the page right after its last one when that page is free, else the pool's
oldest free page. A lone request on consecutive pages is attended as one view of the pool, with no page
gather (`attention_metadata.py`). Before this rule, a verify step that crossed a page boundary and was
rewound gave its new page back to the end of the pool and took another one next time. From then on, every
layer of every step copied the whole context out of the cache: a 1.3k-token verify step went from
49.5 ms to 61 ms on a 2-core Xeon.

Prefix caching (``enable_prefix_caching``, vLLM's automatic prefix caching): a page full of verified
tokens is *registered* (`register`) under its *digest*: SHA-256 over the digest of the page before it
and the page's own token ids (`page_digest`), so a digest names every token up to the page's end. Two
different prefixes share a page only through a SHA-256 collision. (Python's ``hash()`` of the parent's
hash, used before, is 64 bits and invertible step by step: a caller who knows a victim's first page
could craft a first page of their own with the same hash, and the victim's second page would then be
served K/V computed after the crafted one.) A new request takes the longest run of registered pages
its tokens start with (`cached_prefix`) and computes only the rest. Pages are reference-counted: a registered page no request holds stays cached (*evictable*)
until the pool needs it, oldest first. Only full pages of verified tokens are ever shared, so a
request writes only into pages it holds alone: its draft slots and rejected drafts are past its
verified tokens, and `rewind` never reaches a shared page. Evictable pages count as free.

A request's ``cache_salt`` (vLLM's) starts its chain at a digest of the salt (`root_digest`) instead of
`ROOT_DIGEST`, so pages of requests with different salts never match: one tenant can neither read
another's K/V nor learn from a cache hit (``cached_tokens``) that another sent a prompt. Unsalted
requests share one namespace, as before salts.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque

#: the digest before an unsalted request's first page
ROOT_DIGEST = bytes(32)
#: what a salt's digest starts with: a page's digest input starts with a digest, never with these
#: bytes, so no salt's root can equal a page's digest (short of a SHA-256 preimage)
_SALT_TAG = b"specexec cache_salt\0"


def root_digest(cache_salt: str | None) -> bytes:
    """The digest before a request's first page: `ROOT_DIGEST` unsalted, else SHA-256 of a tag and
    the salt's UTF-8 bytes (a lone surrogate, which JSON can carry, encoded as is rather than refused)."""
    if cache_salt is None:
        return ROOT_DIGEST
    return hashlib.sha256(_SALT_TAG + cache_salt.encode("utf-8", "surrogatepass")).digest()


def page_digest(parent: bytes, page_token_ids) -> bytes:
    """SHA-256 of the previous page's digest (`ROOT_DIGEST` for the first) and this page's token ids as
    fixed-width int64s: the key of a page holding exactly these tokens after exactly that prefix."""
    return hashlib.sha256(parent + array("q", page_token_ids).tobytes()).digest()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be > 0, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._free: set[int] = set(range(num_blocks))
        #: free pages, oldest first; a page taken out of turn (the one after a request's last) stays here
        #: until it reaches the front, where pages no longer free are skipped
        self._free_order: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[str, list[int]] = {}
        self.num_slots: dict[str, int] = {}  # token slots held by each request
        self.ref_counts: list[int] = [0] * num_blocks  #: requests holding each page
        #: prefix caching: registered pages (digest -> page) and each one's digest, each request's chain
        #: of digests over its full pages, and the registered pages no request holds, least recently
        #: released first
        self._cached: dict[bytes, int] = {}
        self._page_digest: dict[int, bytes] = {}
        self._digests: dict[str, list[bytes]] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()

    @property
    def num_free_blocks(self) -> int:
        """Pages a request could take: free ones and cached ones no request holds."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Registered pages (held or evictable)."""
        return len(self._cached)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def _num_new_blocks(self, request_id: str, num_tokens: int) -> int:
        held = self.num_slots.get(request_id, 0)
        return cdiv(held + num_tokens, self.block_size) - len(self.block_tables.get(request_id, ()))

    def can_allocate(self, num_tokens: int, cached: tuple[list[int], list[bytes]] = ([], [])) -> bool:
        """Whether a new request fits: ``num_tokens`` new slots after the ``cached`` pages it shares
        (`cached_prefix`; sharing an evictable page takes it out of the free count)."""
        pages, _ = cached
        evictable = sum(page in self._evictable for page in pages)
        return cdiv(num_tokens, self.block_size) <= self.num_free_blocks - evictable

    def allocate(
        self, request_id: str, num_tokens: int, cached: tuple[list[int], list[bytes]] = ([], [])
    ) -> None:
        """Give a new request the ``cached`` pages of its prefix (`cached_prefix`: pages, their digests),
        then pages for ``num_tokens`` more tokens."""
        if request_id in self.block_tables:
            raise KeyError(f"request {request_id!r} already holds pages")
        if not self.can_allocate(num_tokens, cached):
            raise RuntimeError(
                f"out of KV pages: need {cdiv(num_tokens, self.block_size)}, {self.num_free_blocks} free"
            )
        pages, digests = cached
        for page in pages:
            self._evictable.pop(page, None)
            self.ref_counts[page] += 1
        self.block_tables[request_id] = list(pages)
        self.num_slots[request_id] = len(pages) * self.block_size
        if self.enable_prefix_caching:
            self._digests[request_id] = list(digests)
        self.append(request_id, num_tokens)

    def can_append(self, request_id: str, num_tokens: int) -> bool:
        return self._num_new_blocks(request_id, num_tokens) <= self.num_free_blocks

    def append(self, request_id: str, num_tokens: int) -> None:
        """Grow a request by ``num_tokens`` slots, taking new pages as needed."""
        num_new = self._num_new_blocks(request_id, num_tokens)
        if num_new > self.num_free_blocks:
            raise RuntimeError(f"out of KV pages: need {num_new}, {self.num_free_blocks} free")
        table = self.block_tables[request_id]
        for _ in range(max(num_new, 0)):
            page = self._take_page(table)
            self.ref_counts[page] = 1
            table.append(page)
        self.num_slots[request_id] += num_tokens

    def _take_page(self, table: list[int]) -> int:
        """The page after the table's last one when it is free, else the oldest free page, else the
        least recently released cached page (its registration dropped)."""
        following = table[-1] + 1 if table else -1
        if following in self._free:
            self._free.remove(following)
            return following
        if not self._free:
            page, _ = self._evictable.popitem(last=False)
            del self._cached[self._page_digest.pop(page)]
            return page
        while (page := self._free_order.popleft()) not in self._free:
            pass  # taken out of turn earlier (every free page has an entry further on)
        self._free.remove(page)
        return page

    def _release(self, pages) -> None:
        """A holder lets go of these pages: a page no one holds any more is cached (registered) or free."""
        unheld = []
        for page in pages:
            self.ref_counts[page] -= 1
            if self.ref_counts[page] == 0:
                if page in self._page_digest:
                    self._evictable[page] = None
                else:
                    unheld.append(page)
        self._give_back(unheld)

    # ---- prefix caching ------------------------------------------------------------------------------
    def cached_prefix(
        self, token_ids: list[int], max_tokens: int, cache_salt: str | None = None
    ) -> tuple[list[int], list[bytes]]:
        """(pages, their digests) of the longest run of registered pages ``token_ids`` starts with under
        ``cache_salt``, at most ``max_tokens`` tokens' worth (a request must compute at least its last
        token)."""
        pages: list[int] = []
        digests: list[bytes] = []
        if not self.enable_prefix_caching:
            return pages, digests
        bs, parent = self.block_size, root_digest(cache_salt)
        for i in range(max_tokens // bs):
            parent = page_digest(parent, token_ids[i * bs : (i + 1) * bs])
            page = self._cached.get(parent)
            if page is None:
                break
            pages.append(page)
            digests.append(parent)
        return pages, digests

    def register(
        self, request_id: str, token_ids: list[int], num_verified: int, cache_salt: str | None = None
    ) -> None:
        """Register the request's pages that are full of verified tokens (its first ``num_verified``
        tokens' K/V written and kept) so later requests of its ``cache_salt`` can share them."""
        if not self.enable_prefix_caching or request_id not in self.block_tables:
            return
        digests, table, bs = (
            self._digests.setdefault(request_id, []),
            self.block_tables[request_id],
            self.block_size,
        )
        for i in range(len(digests), min(num_verified // bs, len(table))):
            parent = digests[-1] if digests else root_digest(cache_salt)
            digest = page_digest(parent, token_ids[i * bs : (i + 1) * bs])
            digests.append(digest)
            page = table[i]
            if digest not in self._cached and page not in self._page_digest:
                self._cached[digest] = page
                self._page_digest[page] = digest

    def drop_cached(self) -> int:
        """Forget every cached page no request holds (they become free); the number dropped. Pages a
        request holds stay registered."""
        dropped = list(self._evictable)
        for page in dropped:
            del self._cached[self._page_digest.pop(page)]
        self._evictable.clear()
        self._give_back(dropped)
        return len(dropped)

    def _give_back(self, pages) -> None:
        for page in pages:
            self._free.add(page)
            self._free_order.append(page)
        if len(self._free_order) > 2 * self.num_blocks:  # drop the entries of pages no longer free
            kept: set[int] = set()
            order, self._free_order = self._free_order, deque()
            for page in order:
                if page in self._free and page not in kept:
                    kept.add(page)
                    self._free_order.append(page)

    def rewind(self, request_id: str, num_tokens: int) -> None:
        """Drop the last ``num_tokens`` slots; pages falling wholly past the new length go back to the pool."""
        held = self.num_slots[request_id]
        if not 0 <= num_tokens <= held:
            raise ValueError(f"cannot rewind {num_tokens} of {held} slots")
        new_len = held - num_tokens
        table = self.block_tables[request_id]
        keep = cdiv(new_len, self.block_size)
        if len(table) > keep:
            self._release(reversed(table[keep:]))
            del table[keep:]
        digests = self._digests.get(request_id)
        if digests is not None and len(digests) > new_len // self.block_size:  # (pages of verified tokens
            del digests[new_len // self.block_size :]  # are never rewound; a caller's rewind may go further)
        self.num_slots[request_id] = new_len

    def free(self, request_id: str) -> None:
        """Let go of all of a request's pages (no-op for a request that holds none)."""
        table = self.block_tables.pop(request_id, None)
        self.num_slots.pop(request_id, None)
        self._digests.pop(request_id, None)
        if table:
            self._release(reversed(table))

    def check_references(self) -> None:
        """Raise AssertionError unless every page's reference count equals the tables holding it, and
        every page is held, cached without a holder, or free, exactly one of them (tests and soaks)."""
        holders = [0] * self.num_blocks
        for table in self.block_tables.values():
            for page in table:
                holders[page] += 1
        assert holders == self.ref_counts, "a page's reference count is not its holders"
        unheld = {p for p in range(self.num_blocks) if holders[p] == 0}
        assert set(self._evictable) | self._free == unheld, "a page is lost, or held and free at once"
        assert not set(self._evictable) & self._free, "a page is cached and free at once"
        assert set(self._evictable) <= set(self._page_digest), "an evictable page is not registered"
        assert {d: p for p, d in self._page_digest.items()} == self._cached, "the cache's maps disagree"
