"""Batch sampler: greedy rows by argmax, the others from filtered probabilities."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .host_values import device_tensor
from .logits import compute_probs
from .params import SamplingParams, filter_flags


def draw_token(probs_row: Tensor, generator: torch.Generator | None) -> Tensor:
    """One token id drawn from `probs_row` [vocab] (non-negative weights, not all zero; need not sum to
    1): a [1] long tensor on probs_row's device, read by nobody until the caller does.

    ``torch.multinomial``'s own one-sample algorithm (the exponential race: argmax of p / E with E ~
    Exp(1), drawn with the same generator call), so it returns exactly multinomial's token for the same
    generator state; but multinomial first checks its input with two reads back to the host, which on
    CUDA make the host wait for the device at every draw. The callers' rows are valid by construction.
    """
    race = torch.empty_like(probs_row).exponential_(1, generator=generator)
    return torch.argmax(probs_row / race, dim=-1, keepdim=True)


def sample_from_probs(probs_row: Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from `probs_row` [vocab] (non-negative weights; need not sum to 1).

    `generator` None uses the global RNG; otherwise it must live on probs_row's device.
    """
    return int(draw_token(probs_row, generator).item())


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
        temperature = device_tensor([p.temperature for p in rows], torch.float32, device)
        top_k = device_tensor([p.top_k for p in rows], torch.long, device)
        top_p = device_tensor([p.top_p for p in rows], torch.float32, device)
        min_p = device_tensor([p.min_p for p in rows], torch.float32, device)
        index = device_tensor(sampled, torch.long, device)  # [num_sampled]
        flags = filter_flags(rows, logits.shape[-1])
        probs = compute_probs(
            logits[index], temperature, top_k, top_p, min_p, **flags
        )  # [num_sampled, vocab]
        draws = [draw_token(probs[j], generators[row]) for j, row in enumerate(sampled)]  # num_sampled x [1]
        tokens[index] = torch.cat(draws)
        return tokens
