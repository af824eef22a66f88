"""Hands out fixed-size KV-cache pages ("blocks") to requests.

A request's block table lists its pages in order; token position ``p`` lives in slot
``block_table[p // block_size] * block_size + p % block_size`` of the flat KV pool.
Methods come in predicate/action pairs (``can_allocate``/``allocate``, ``can_append``/``append``).
"""

from __future__ import annotations

from collections import deque


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be > 0, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[str, list[int]] = {}
        self.num_slots: dict[str, int] = {}  # token slots held by each request

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def _num_new_blocks(self, request_id: str, num_tokens: int) -> int:
        held = self.num_slots.get(request_id, 0)
        return cdiv(held + num_tokens, self.block_size) - len(self.block_tables.get(request_id, ()))

    def can_allocate(self, num_tokens: int) -> bool:
        return cdiv(num_tokens, self.block_size) <= len(self._free)

    def allocate(self, request_id: str, num_tokens: int) -> None:
        """Give a new request pages for its first ``num_tokens`` tokens."""
        if request_id in self.block_tables:
            raise KeyError(f"request {request_id!r} already holds pages")
        if not self.can_allocate(num_tokens):
            raise RuntimeError(
                f"out of KV pages: need {cdiv(num_tokens, self.block_size)}, {len(self._free)} free"
            )
        self.block_tables[request_id] = []
        self.num_slots[request_id] = 0
        self.append(request_id, num_tokens)

    def can_append(self, request_id: str, num_tokens: int) -> bool:
        return self._num_new_blocks(request_id, num_tokens) <= len(self._free)

    def append(self, request_id: str, num_tokens: int) -> None:
        """Grow a request by ``num_tokens`` slots, taking new pages as needed."""
        num_new = self._num_new_blocks(request_id, num_tokens)
        if num_new > len(self._free):
            raise RuntimeError(f"out of KV pages: need {num_new}, {len(self._free)} free")
        table = self.block_tables[request_id]
        for _ in range(max(num_new, 0)):
            table.append(self._free.popleft())
        self.num_slots[request_id] += num_tokens

    def rewind(self, request_id: str, num_tokens: int) -> None:
        """Drop the last ``num_tokens`` slots; pages falling wholly past the new length go back to the pool."""
        held = self.num_slots[request_id]
        if not 0 <= num_tokens <= held:
            raise ValueError(f"cannot rewind {num_tokens} of {held} slots")
        new_len = held - num_tokens
        table = self.block_tables[request_id]
        keep = cdiv(new_len, self.block_size)
        while len(table) > keep:
            self._free.append(table.pop())
        self.num_slots[request_id] = new_len

    def free(self, request_id: str) -> None:
        """Return all of a request's pages (no-op for a request that holds none)."""
        table = self.block_tables.pop(request_id, None)
        self.num_slots.pop(request_id, None)
        if table:
            self._free.extend(reversed(table))
