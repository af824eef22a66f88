"""One step's drafts, flattened: what verification reads, built once per step (vLLM v1's shape).

A batch of ``batch`` producing requests, request i with ``k_i`` drafts, owns ``k_i + 1`` rows of the
step's verify logits, laid out request after request: its draft rows (row j scores draft j) and then its
bonus row (the position after its last draft). Everything here indexes those rows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class SpecDecodeMetadata:
    draft_token_ids: torch.Tensor  # [num_drafts] long, request after request
    num_draft_tokens: list[int]  # [batch] k_i (host copy)
    cu_num_draft_tokens: torch.Tensor  # [batch + 1] long, offsets of each request's drafts
    target_logits_indices: torch.Tensor  # [num_drafts] row scoring each draft
    bonus_logits_indices: torch.Tensor  # [batch] each request's bonus row
    logits_indices: torch.Tensor  # [num_drafts + batch] rows of each request in order: drafts, then bonus
    draft_probs: torch.Tensor | None  # [num_drafts, vocab] q of each draft; rows of requests without q are 0
    has_draft_probs: list[bool]  # [batch] whether request i's drafts came with q
    padded_draft_ids: torch.Tensor  # [batch, max_spec_len] long, -1 past a request's drafts
    padded_rows: torch.Tensor  # [batch, max_spec_len + 1] long, request i's rows (past k_i: its bonus row)

    @property
    def batch_size(self) -> int:
        return len(self.num_draft_tokens)

    @property
    def max_spec_len(self) -> int:
        return max(self.num_draft_tokens, default=0)

    @property
    def cu_rows(self) -> list[int]:
        """[batch + 1] host offsets of each request's rows (``k_i + 1`` each)."""
        cu = [0]
        for k in self.num_draft_tokens:
            cu.append(cu[-1] + k + 1)
        return cu

    @classmethod
    def build(
        cls,
        draft_token_ids: list[list[int]],
        draft_probs: list[torch.Tensor | None] | None = None,
        vocab_size: int | None = None,
        device: torch.device | str = "cpu",
    ) -> SpecDecodeMetadata:
        """From each request's drafts (and q, ``[k_i, vocab]`` or None); every index comes from host
        integers in one copy to the device. A batch without drafts (every plain decode step) depends only
        on its size: built once per size and device, and shared (nothing reading it writes to it)."""
        counts = [len(d) for d in draft_token_ids]
        if not any(counts):
            return _without_drafts(cls, len(counts), torch.device(device))
        return cls._build(draft_token_ids, counts, draft_probs, vocab_size, device)

    @classmethod
    def _build(cls, draft_token_ids, counts, draft_probs, vocab_size, device) -> SpecDecodeMetadata:
        cu_drafts, target_rows, bonus_rows, row = [0], [], [], 0
        for k in counts:
            target_rows.extend(range(row, row + k))
            bonus_rows.append(row + k)
            row += k + 1
            cu_drafts.append(cu_drafts[-1] + k)
        flat = [t for d in draft_token_ids for t in d]
        logits_rows = list(range(row))
        width = max(counts, default=0)
        padded_ids = [t for d in draft_token_ids for t in list(d) + [-1] * (width - len(d))]
        padded_rows = [cu_drafts[i] + i + min(j, k) for i, k in enumerate(counts) for j in range(width + 1)]
        host = torch.tensor(
            flat + cu_drafts + target_rows + bonus_rows + logits_rows + padded_ids + padded_rows,
            dtype=torch.long,
        )
        packed = host.to(device, non_blocking=True)
        num, batch = len(flat), len(counts)
        parts = packed.split([num, batch + 1, num, batch, row, batch * width, batch * (width + 1)])
        probs = draft_probs if draft_probs is not None else [None] * batch
        has = [p is not None and k > 0 for p, k in zip(probs, counts)]
        q = None
        if any(has):
            vocab = vocab_size or next(p.shape[1] for p, h in zip(probs, has) if h)
            q = torch.zeros(num, vocab, dtype=torch.float32, device=device)  # [num_drafts, vocab]
            for i, (p, h) in enumerate(zip(probs, has)):
                if h:
                    q[cu_drafts[i] : cu_drafts[i + 1]] = p[: counts[i], :vocab].to(device, torch.float32)
        return cls(
            parts[0],
            counts,
            parts[1],
            parts[2],
            parts[3],
            parts[4],
            q,
            has,
            parts[5].view(batch, width),
            parts[6].view(batch, width + 1),
        )

    @classmethod
    def make_dummy(cls, draft_token_ids: list[list[int]], device: torch.device | str = "cpu"):
        """Metadata for these drafts without q (tests, warm-up and capture of a fixed verify shape)."""
        return cls.build(draft_token_ids, None, None, device)


@functools.lru_cache(maxsize=256)
def _without_drafts(cls, batch: int, device: torch.device) -> SpecDecodeMetadata:
    """The metadata of ``batch`` requests without drafts: one host tensor, its copy and 7 views, built once."""
    return cls._build([[]] * batch, [0] * batch, None, None, device)
