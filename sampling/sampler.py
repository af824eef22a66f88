"""Batch sampler: greedy rows by argmax, the others from filtered probabilities."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .logits import compute_probs
from .params import SamplingParams


def _draw(probs_row: Tensor, generator: torch.Generator | None) -> Tensor:
    """One token id drawn from `probs_row` [vocab]: a [1] long tensor on probs_row's device."""
    return torch.multinomial(probs_row, num_samples=1, generator=generator)


def sample_from_probs(probs_row: Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from `probs_row` [vocab] (non-negative weights; need not sum to 1).

    `generator` None uses the global RNG; otherwise it must live on probs_row's device.
    """
    return int(_draw(probs_row, generator).item())


class Sampler:
    """Picks one token per row of a logits batch, honouring each row's SamplingParams."""

    sample_from_probs = staticmethod(sample_from_probs)

    def sample(
        self,
        logits: Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
    ) -> Tensor:
        """Token ids [num_rows] long for logits [num_rows, vocab].

        Greedy rows (temperature 0) take the argmax of the raw logits (so float64 logits give an exact
        argmax); the others draw from `compute_probs` with their own generator (None = global RNG).
        """
        num_rows = logits.shape[0]
        if len(params) != num_rows or len(generators) != num_rows:
            raise ValueError(
                f"need one SamplingParams and one generator per row: {num_rows} rows, "
                f"{len(params)} params, {len(generators)} generators"
            )
        tokens = logits.argmax(dim=-1)  # [num_rows]; sampled rows are overwritten below
        sampled = [i for i, p in enumerate(params) if not p.is_greedy]
        if not sampled:
            return tokens

        device = logits.device
        rows = [params[i] for i in sampled]
        temperature = torch.tensor([p.temperature for p in rows], dtype=torch.float32, device=device)
        top_k = torch.tensor([p.top_k for p in rows], dtype=torch.long, device=device)
        top_p = torch.tensor([p.top_p for p in rows], dtype=torch.float32, device=device)
        min_p = torch.tensor([p.min_p for p in rows], dtype=torch.float32, device=device)
        index = torch.tensor(sampled, dtype=torch.long, device=device)  # [num_sampled]
        probs = compute_probs(logits[index], temperature, top_k, top_p, min_p)  # [num_sampled, vocab]
        draws = [_draw(probs[j], generators[row]) for j, row in enumerate(sampled)]  # num_sampled x [1]
        tokens[index] = torch.cat(draws)
        return tokens
