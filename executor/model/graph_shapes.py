"""The fixed shapes a model's decode/verify forward is captured at, and which one a step replays.

A captured forward has one shape: ``num_seqs`` sequences (a batch-size bucket), each with ``query_len``
new tokens (padded), each reading ``num_blocks`` KV pages (padded). A step fits a shape when it has at
most ``num_seqs`` sequences, none with more new tokens than ``query_len`` nor more pages than
``num_blocks``; it replays the smallest such shape. Anything larger (a long prefill chunk, a batch
above the largest bucket) runs eagerly.

Key pages are bucketed too because attention reads each sequence's pages through its block table
into one padded tensor: a shape sized for the longest context would make every short-context step
read ``max_model_len`` keys per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

#: batch sizes captured (those up to max_batch_size, and max_batch_size itself when it is not one)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
#: the smallest key-length bucket, in tokens: contexts below it all share one shape
MIN_KV_TOKENS = 512


@dataclass(frozen=True, slots=True, order=True)
class GraphShape:
    num_seqs: int  #: sequences in the captured batch (padding sequences included)
    query_len: int  #: new tokens per sequence (1 + drafts, padded)
    num_blocks: int  #: KV pages each sequence's attention reads

    @property
    def num_tokens(self) -> int:
        return self.num_seqs * self.query_len


def _powers_of_two_up_to(limit: int, start: int = 1) -> list[int]:
    out, n = [], start
    while n < limit:
        out.append(n)
        n *= 2
    return [*out, limit]


@dataclass(frozen=True, slots=True)
class GraphShapes:
    """The buckets of one model: batch sizes x query lengths x key pages."""

    batch_sizes: tuple[int, ...]
    query_lens: tuple[int, ...]
    block_counts: tuple[int, ...]
    max_num_tokens: int  #: no shape holds more tokens than a forward's input buffers

    @classmethod
    def for_model(
        cls,
        max_batch_size: int,
        query_lens: tuple[int, ...],
        max_blocks: int,
        block_size: int,
        max_num_tokens: int,
    ) -> GraphShapes:
        """Buckets for a model whose steps hold at most ``max_batch_size`` sequences of the given query
        lengths (a verify step pads to the next one: say 1, 1 + max drafts), over at most ``max_blocks``
        pages (``max_model_len``); key pages double from `MIN_KV_TOKENS` up to ``max_blocks``."""
        batch = [b for b in BATCH_BUCKETS if b < max_batch_size] + [min(max_batch_size, BATCH_BUCKETS[-1])]
        min_blocks = min(max_blocks, -(-MIN_KV_TOKENS // block_size))
        blocks = _powers_of_two_up_to(max_blocks, start=max(1, min_blocks))
        queries = sorted({q for q in query_lens if q >= 1})
        return cls(tuple(dict.fromkeys(batch)), tuple(queries), tuple(blocks), max_num_tokens)

    def all(self) -> list[GraphShape]:
        """Every shape, largest first (captured in that order, the smaller graphs reuse the larger
        ones' memory in the shared pool)."""
        shapes = [
            GraphShape(b, q, n)
            for b in self.batch_sizes
            for q in self.query_lens
            for n in self.block_counts
            if b * q <= self.max_num_tokens
        ]
        return sorted(shapes, reverse=True)

    def pick(self, num_seqs: int, max_query_len: int, max_blocks: int) -> GraphShape | None:
        """The smallest shape that holds a step, or None (the step runs eagerly)."""
        b = next((x for x in self.batch_sizes if x >= num_seqs), None)
        q = next((x for x in self.query_lens if x >= max_query_len), None)
        n = next((x for x in self.block_counts if x >= max_blocks), None)
        if b is None or q is None or n is None or b * q > self.max_num_tokens:
            return None
        return GraphShape(b, q, n)

    @property
    def bound(self) -> GraphShape:
        """The largest value of each dimension: input buffers sized for it hold every shape."""
        return GraphShape(max(self.batch_sizes), max(self.query_lens), max(self.block_counts))
