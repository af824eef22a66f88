"""Training-time test (EAGLE-3): the head is unrolled for several steps, each fed its own output.

Step 0 at index t sees the target's fused features ``h_t`` and the token ``x_{t+1}`` (position t) and
is scored against the target's distribution of ``x_{t+2}``. Step k at index t continues the draft chain
that starts at t: it is fed the head's step k-1 output at t and the token ``x_{t+1+k}`` (position t+k),
and is scored against the target's distribution of ``x_{t+2+k}``. Its query attends the step-0 keys of
indices <= t (the real context, as the inference cache holds) and the keys of steps 1..k at index t
(its own earlier drafts): exactly what drafting k tokens after position t sees. A head with a
``sliding_window`` sees, as in drafting, only the step-0 keys less than that far behind its own position
t+k.

Loss: soft cross-entropy against the target's distribution renormalized over the draft vocabulary,
step k weighted 0.8^k; left out are positions whose target argmax lies outside that vocabulary (they
still count, as misses, in the agreement) and those whose target is still a prompt token (the prompt
is context, its text not the target's). Only the scored rows go through the head's lm_head and the
loss (padding and left-out positions are dropped before it), and the target's side is computed once per
batch: the [B, T, draft_vocab] tensors are the step's largest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..head import Eagle3Head

STEP_WEIGHT = 0.8


@dataclass(slots=True)
class Batch:
    aux: torch.Tensor  # [B, T, 3 * target_hidden] features at positions t
    next_ids: torch.Tensor  # [B, T] x_{t+1}: the token fed with h_t
    positions: torch.Tensor  # [B, T] position t
    target_probs: torch.Tensor  # [B, T, draft_vocab] target probabilities of x_{t+2}, over the draft vocab
    target_ids: torch.Tensor  # [B, T] the target's most likely draft id for x_{t+2}
    valid: torch.Tensor  # [B, T] bool: a real index whose target argmax is in the draft vocab
    real: torch.Tensor  # [B, T] bool: a real (not padding) index
    answer: torch.Tensor  # [B, T] bool: a real index whose target is an answer token (in the vocab or not)


class ChainAttention:
    """The attention callback of one unrolled training step (see the module docstring)."""

    def __init__(
        self, batch_size: int, length: int, real: torch.Tensor, sliding_window: int | None = None
    ) -> None:
        self.b, self.t = batch_size, length
        causal = torch.ones(length, length, dtype=torch.bool, device=real.device).tril()  # [T, T]
        self.mask = causal[None] & real[:, None, :]  # [B, T(query), T(key)]
        self.window = sliding_window
        index = torch.arange(length, device=real.device)
        self.distance = index[:, None] - index[None, :]  # [T(query), T(key)]
        self.keys: list[torch.Tensor] = []  # per step [B, heads, T, d]
        self.values: list[torch.Tensor] = []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, t = self.b, self.t
        heads, d = q.shape[1], q.shape[2]
        rep = heads // k.shape[1]
        q = q.view(b, t, heads, d).transpose(1, 2)  # [B, heads, T, d]
        k = k.view(b, t, -1, d).transpose(1, 2).repeat_interleave(rep, dim=1)  # [B, heads, T, d]
        v = v.view(b, t, -1, d).transpose(1, 2).repeat_interleave(rep, dim=1)
        self.keys.append(k)
        self.values.append(v)
        scale = d**-0.5
        scores0 = (q @ self.keys[0].transpose(-1, -2)) * scale  # [B, heads, T, T]
        mask = self.mask
        if self.window is not None:  # step k's query sits at position t + k
            step = len(self.keys) - 1
            mask = mask & (self.distance < self.window - step)[None]
        scores0 = scores0.masked_fill(~mask[:, None], float("-inf"))
        chain = [(q * kj).sum(-1, keepdim=True) * scale for kj in self.keys[1:]]  # k x [B, heads, T, 1]
        probs = torch.cat([scores0, *chain], dim=-1).softmax(-1)  # [B, heads, T, T + k]
        out = probs[..., :t] @ self.values[0]  # [B, heads, T, d]
        for j, vj in enumerate(self.values[1:]):
            out = out + probs[..., t + j : t + j + 1] * vj
        return out.transpose(1, 2).reshape(b * t, heads, d)


def ttt_loss(head: Eagle3Head, batch: Batch, num_steps: int) -> tuple[torch.Tensor, list[float], list[float]]:
    """Weighted loss over ``num_steps`` unrolled steps; also each step's loss and top-1 agreement. The
    agreement is over every answer position, those whose target lies outside the draft vocabulary
    counted as misses (a draft can never match there), so heads with different vocabularies compare."""
    b, t = batch.next_ids.shape
    attend = ChainAttention(b, t, batch.real, head.config.sliding_window)
    hidden = head.fuse(batch.aux.reshape(b * t, -1))  # [B*T, hidden]
    total = hidden.new_zeros(())
    losses, agreements = [], []
    for k in range(num_steps):
        # step k at index t is fed x_{t+1+k} at position t+k and scored on x_{t+2+k}
        ids = _shift(batch.next_ids, k, 0)
        pos = batch.positions + k
        hidden = head.step(ids.reshape(-1), hidden, pos.reshape(-1), attend)
        scored = batch.valid[:, k:] & batch.real[:, : t - k]  # [B, T - k]: index t scored on t + k
        rows = hidden.view(b, t, -1)[:, : t - k][scored]  # [n, hidden]
        logits = head.logits(rows).float()  # [n, draft_vocab]
        n = max(rows.shape[0], 1)
        loss = F.cross_entropy(logits, batch.target_probs[:, k:][scored], reduction="sum") / n
        total = total + STEP_WEIGHT**k * loss
        agree = logits.argmax(-1) == batch.target_ids[:, k:][scored]
        num_answer = int((batch.answer[:, k:] & batch.real[:, : t - k]).sum())
        losses.append(float(loss.detach()))
        agreements.append(float(agree.sum()) / max(num_answer, 1))
    return total, losses, agreements


def _shift(x: torch.Tensor, k: int, fill) -> torch.Tensor:
    """x[:, t + k] at index t (the last k indices filled with ``fill``)."""
    if k == 0:
        return x
    pad = torch.full_like(x[:, :k], fill)
    return torch.cat([x[:, k:], pad], dim=1)
