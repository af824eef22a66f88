"""Which attention kernel runs each kind of short-query group: decode rows (one query per request) and
verify rows (``1 + k``), for one request and for a batch, over a short and a long context. The kernel
plan measures them (`kernel_plan/attention_path.py`); the runner asks `AttentionPaths.for_group`.
Prefill chunks always take SDPA (its causal kernel when nothing is cached)."""

from __future__ import annotations

from dataclasses import dataclass

from ..layers.attention_kernels import AUTO, PAGED_CPU, PAGED_TRITON, SDPA

CONTEXTS = (256, 2048)  #: keys per request in the timed calls: a short and a long context
CONTEXT_SPLIT = 768  #: groups reading fewer keys than this take the short-context choice
VERIFY_QUERY_LEN = 4  #: 1 + 3 drafts
#: the timed shapes, in `AttentionPaths` order: (name, requests, queries per request)
CASES = (
    ("decode_single", 1, 1),
    ("decode_batched", 8, 1),
    ("verify_single", 1, VERIFY_QUERY_LEN),
    ("verify_batched", 8, VERIFY_QUERY_LEN),
)
_UNMEASURED = (AUTO,) * len(CASES)


@dataclass(frozen=True, slots=True)
class AttentionPaths:
    """The kernel for each kind of short-query group — one query per request (decode) or 2..64
    (verify), one request or several — over a short and over a long context (`CASES` order)."""

    short_context: tuple[str, ...] = _UNMEASURED
    long_context: tuple[str, ...] = _UNMEASURED

    @classmethod
    def all(cls, path: str) -> AttentionPaths:
        return cls((path,) * len(CASES), (path,) * len(CASES))

    def batches_read_pages_in_place(self) -> bool:
        """Whether every batched decode and verify case takes a kernel that reads each request's own
        keys from the pages (the C++ or the Triton one): a group padded in keys then costs nothing."""
        batched = [i for i, (_, requests, _) in enumerate(CASES) if requests > 1]
        chosen = [paths[i] for paths in (self.short_context, self.long_context) for i in batched]
        return all(path in (PAGED_CPU, PAGED_TRITON) for path in chosen)

    def for_group(self, max_query_len: int, is_short: bool, num_queries: int = 1, max_kv_len: int = 0) -> str:
        if not is_short:
            return SDPA
        case = (0 if max_query_len == 1 else 2) + (0 if num_queries == 1 else 1)
        return (self.short_context if max_kv_len < CONTEXT_SPLIT else self.long_context)[case]
