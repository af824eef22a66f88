"""Pure logit filters: temperature, top-k, top-p, min-p.

Filters apply in this order, each on the result of the previous one:
1. temperature: logits / temperature (rows with temperature 0 use 1; the caller argmaxes them);
2. top-k: keep the k largest logits (0 = off);
3. top-p: keep the smallest prefix of the top-k survivors, by descending probability (renormalised
   over the survivors), whose cumulative probability reaches top_p (1 = off);
4. min-p: drop tokens whose probability (over the survivors) is < min_p * the largest probability (0 = off).

Filtered entries become -inf. The argmax always survives, so no row is ever emptied.
"""

from __future__ import annotations

import torch
from torch import Tensor


def apply_sampling_filters(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    min_p: Tensor,
    *,
    has_top_k_top_p: bool | None = None,
    has_min_p: bool | None = None,
) -> Tensor:
    """Scaled and filtered float32 logits, same shape as `logits`.

    logits [num_rows, vocab]; temperature, top_p, min_p [num_rows] float; top_k [num_rows] long.
    has_top_k_top_p, has_min_p: whether any row uses those filters, when the caller knows it on the host
    (`params.filter_flags`); None reads it from the tensors, which waits for the device.
    """
    vocab = logits.shape[-1]
    temperature = temperature.to(device=logits.device, dtype=torch.float32)  # [num_rows]
    temperature = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    out = logits.float() / temperature[:, None]  # [num_rows, vocab]

    top_k = top_k.to(device=logits.device, dtype=torch.long)  # [num_rows]
    top_p = top_p.to(device=logits.device, dtype=torch.float32)  # [num_rows]
    use_top_k = (top_k > 0) & (top_k < vocab)  # [num_rows]
    use_top_p = top_p < 1  # [num_rows]
    if has_top_k_top_p is None:
        has_top_k_top_p = bool((use_top_k | use_top_p).any())
    if has_top_k_top_p:
        out = _top_k_top_p(out, top_k, use_top_k, top_p, use_top_p)

    min_p = min_p.to(device=logits.device, dtype=torch.float32)  # [num_rows]
    if has_min_p is None:
        has_min_p = bool((min_p > 0).any())
    if has_min_p:
        probs = torch.softmax(out, dim=-1)  # [num_rows, vocab]
        threshold = min_p[:, None] * probs.amax(dim=-1, keepdim=True)  # [num_rows, 1]
        # The max has prob == max >= min_p * max (min_p <= 1), so it always survives.
        out = out.masked_fill(probs < threshold, float("-inf"))
    return out


def _top_k_top_p(out: Tensor, top_k: Tensor, use_top_k: Tensor, top_p: Tensor, use_top_p: Tensor) -> Tensor:
    """Top-k then top-p with one descending sort; position 0 (the argmax) is never dropped."""
    vocab = out.shape[-1]
    # stable: among ties, the lowest index comes first, matching torch.argmax.
    sorted_logits, order = torch.sort(out, dim=-1, descending=True, stable=True)  # [num_rows, vocab] x2
    positions = torch.arange(vocab, device=out.device)[None, :]  # [1, vocab]

    k = torch.where(use_top_k, top_k, torch.full_like(top_k, vocab))  # [num_rows]
    drop = positions >= k[:, None]  # [num_rows, vocab]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))

    sorted_probs = torch.softmax(sorted_logits, dim=-1)  # [num_rows, vocab]
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # [num_rows, vocab], exclusive cumsum
    # Keep a token while the mass before it is still short of top_p; rows with top_p == 1 skip this
    # (rounding could push the cumsum to 1.0 before the tail).
    drop = (mass_before >= top_p[:, None]) & use_top_p[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))

    return torch.empty_like(out).scatter_(-1, order, sorted_logits)


def compute_probs(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor, **filters: bool | None
) -> Tensor:
    """float32 softmax of `apply_sampling_filters(...)` (``filters``: its has_* flags): [num_rows, vocab]."""
    return torch.softmax(apply_sampling_filters(logits, temperature, top_k, top_p, min_p, **filters), dim=-1)
