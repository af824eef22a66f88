"""Grammar masks for one drafting step of several requests, on the device the draft logits live on.

xgrammar fills bitmask rows on the host. For CUDA logits the rows go to the device in one non-blocking
copy from pinned memory (a pageable copy would make the host wait for the device, and a CPU bitmask
cannot be applied to CUDA logits at all); the next fill waits only for that copy to have left the host
buffer.
"""

from __future__ import annotations

import torch

from ..kernels import apply_mask_inplace


class DraftMasks:
    """Reused mask rows: ``apply(logits, matchers, d2t)`` masks each row whose matcher is not None."""

    def __init__(self, vocab_size: int, device: torch.device | str) -> None:
        self.words = -(-vocab_size // 32)
        self.device = torch.device(device)
        self._on_host = self.device.type == "cpu"
        self._rows = 0
        self._copied = torch.cuda.Event() if self.device.type == "cuda" else None
        self._grow(8)

    def _grow(self, rows: int) -> None:
        pin = self.device.type == "cuda"
        self._host_bitmask = torch.full((rows, self.words), -1, dtype=torch.int32, pin_memory=pin)
        self._host_needs = torch.zeros(rows, dtype=torch.int32, pin_memory=pin)
        if not self._on_host:
            self._bitmask = torch.empty_like(self._host_bitmask, device=self.device)
            self._needs = torch.empty_like(self._host_needs, device=self.device)
        self._rows = rows

    def apply(self, logits: torch.Tensor, matchers: list, d2t: torch.Tensor | None = None) -> None:
        """Mask ``logits`` [len(matchers), vocab] in place, row i by ``matchers[i]`` (None: left alone).
        With ``d2t`` the columns are a draft vocabulary mapped to the target's (EAGLE-3)."""
        n = len(matchers)
        if not any(m is not None for m in matchers):
            return
        if self._copied is not None:
            self._copied.synchronize()  # the last copy has left the host rows
        if n > self._rows:
            self._grow(max(n, 2 * self._rows))
        bitmask, needs = self._host_bitmask[:n], self._host_needs[:n]  # [n, words], [n]
        for i, matcher in enumerate(matchers):
            needs[i] = matcher is not None
            if matcher is not None:
                matcher.fill_next_token_bitmask(self._host_bitmask, i)
        if not self._on_host:
            self._bitmask[:n].copy_(bitmask, non_blocking=True)
            self._needs[:n].copy_(needs, non_blocking=True)
            if self._copied is not None:
                self._copied.record()
            bitmask, needs = self._bitmask[:n], self._needs[:n]
        apply_mask_inplace(logits, bitmask, needs, d2t)
