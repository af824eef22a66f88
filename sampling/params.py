"""Per-request sampling parameters."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from numbers import Integral, Real
from typing import Any

import torch

# torch.Generator.manual_seed accepts this range (negative seeds are wrapped).
_SEED_MIN = -(2**63)
_SEED_MAX = 2**64 - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


@dataclass(slots=True)
class SamplingParams:
    """How one request picks its tokens and when it stops.

    Construction never raises for bad values; call `validate()` (the executor does, per request).
    """

    max_tokens: int = (
        128  #: maximum number of output tokens (> 0; 0 only with prompt_logprobs: score the prompt)
    )
    temperature: float = 0.0  #: 0 means greedy (argmax); > 0 samples
    top_k: int = 0  #: keep the k most likely tokens; 0 = off
    top_p: float = 1.0  #: nucleus: keep the smallest set with cumulative prob >= top_p; 1.0 = off
    min_p: float = 0.0  #: drop tokens with prob < min_p * max prob; 0 = off
    seed: int | None = None  #: per-request seed (its own torch.Generator); None = global RNG
    stop: list[str] = field(default_factory=list)  #: stop strings (not included in the output text)
    stop_token_ids: list[int] = field(default_factory=list)  #: extra token ids that end the request
    ignore_eos: bool = False  #: keep going past EOS
    #: vLLM's: the stop tokens (EOS unless ignore_eos, and stop_token_ids) cannot be sampled before this
    #: many output tokens (0..max_tokens; 0 = off; `sampling/min_tokens.py`)
    min_tokens: int = 0
    #: HF's: every token already in the prompt or the output has its logit divided by this when positive,
    #: multiplied when negative (> 0; 1 = off)
    repetition_penalty: float = 1.0
    #: OpenAI's: minus this times the token's count in the output so far (-2..2; 0 = off)
    frequency_penalty: float = 0.0
    #: OpenAI's: minus this once the token is in the output so far (-2..2; 0 = off)
    presence_penalty: float = 0.0
    #: OpenAI's: token id -> a number in -100..100 added to that token's logit at every step (before
    #: temperature and the filters; -100 all but bans it, 100 all but forces it)
    logit_bias: dict[int, float] = field(default_factory=dict)
    #: the log-probability of each output token plus this many likeliest alternatives (0..20); None = off
    #: (which log-probabilities: `sampling/logprobs.py`)
    logprobs: int | None = None
    #: the log-probability of each prompt token (after the first) plus this many likeliest alternatives
    #: (0..20; `sampling/prompt_logprobs.py`); None = off
    prompt_logprobs: int | None = None
    #: samples of the prompt (1..64): each its own request ``<id>#<i>`` with seed + i (when seeded); the
    #: request's output is sample 0's and lists all in ``samples``
    n: int = 1

    def __post_init__(self) -> None:
        # Only normalise types here; validate() reports bad values.
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        if isinstance(self.stop_token_ids, (list, tuple)):
            self.stop_token_ids = list(self.stop_token_ids)

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1 or self.frequency_penalty != 0 or self.presence_penalty != 0

    @property
    def is_greedy(self) -> bool:
        """True when tokens are picked by argmax (temperature == 0)."""
        return self.temperature == 0

    def validate(self) -> None:
        """Raise ValueError naming the first bad field and its allowed values."""
        scores_prompt = self.prompt_logprobs is not None
        if not _is_int(self.max_tokens) or self.max_tokens < (0 if scores_prompt else 1):
            raise ValueError(
                f"max_tokens must be an int > 0 (0 only with prompt_logprobs), got {self.max_tokens!r}"
            )
        if not _is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}"
            )
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be a number with 0 < top_p <= 1 (1 = off), got {self.top_p!r}")
        if not _is_real(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be a number with 0 <= min_p <= 1 (0 = off), got {self.min_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or not _SEED_MIN <= self.seed <= _SEED_MAX):
            raise ValueError(f"seed must be None or an int in [-2**63, 2**64 - 1], got {self.seed!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, list) or not all(
            _is_int(t) and t >= 0 for t in self.stop_token_ids
        ):
            raise ValueError(f"stop_token_ids must be a list of ints >= 0, got {self.stop_token_ids!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= max(self.max_tokens, 0):
            raise ValueError(
                f"min_tokens must be an int in 0..max_tokens ({self.max_tokens!r}), got {self.min_tokens!r}"
            )
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if not _is_int(self.n) or not 1 <= self.n <= 64:
            raise ValueError(f"n must be an int in 1..64, got {self.n!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= 20):
            raise ValueError(f"logprobs must be None or an int in 0..20, got {self.logprobs!r}")
        if scores_prompt and (not _is_int(self.prompt_logprobs) or not 0 <= self.prompt_logprobs <= 20):
            raise ValueError(f"prompt_logprobs must be None or an int in 0..20, got {self.prompt_logprobs!r}")
        if not isinstance(self.logit_bias, dict) or not all(
            _is_int(t) and t >= 0 and _is_real(b) and -100 <= b <= 100 for t, b in self.logit_bias.items()
        ):
            raise ValueError(
                f"logit_bias must map token ids (ints >= 0) to numbers in -100..100, got {self.logit_bias!r:.200}"
            )
        rep = self.repetition_penalty
        if not _is_real(rep) or not math.isfinite(rep) or rep <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 = off), got {rep!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not -2 <= value <= 2:
                raise ValueError(f"{name} must be a number in -2..2 (0 = off), got {value!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SamplingParams:
        """Build from a mapping (e.g. a JSON request); rejects unknown keys, then validates."""
        if not isinstance(d, Mapping):
            raise ValueError(f"sampling parameters must be a mapping, got {type(d).__name__}")
        allowed = sorted(f.name for f in fields(cls))
        unknown = sorted(str(k) for k in d if k not in allowed)
        if unknown:
            raise ValueError(
                f"unknown sampling parameter(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}"
            )
        params = cls(**d)
        params.validate()
        return params

    def make_generator(self, device: torch.device | str) -> torch.Generator | None:
        """A generator seeded with `seed` on `device`, or None (use the global RNG) when unseeded."""
        if self.seed is None:
            return None
        generator = torch.Generator(device=device)
        generator.manual_seed(self.seed)
        return generator


def filter_flags(params: Sequence[SamplingParams], vocab_size: int) -> dict[str, bool]:
    """Which logit filters any of these requests uses, decided on the host (for `compute_probs`, so it
    never reads the device to find out)."""
    return {
        "has_top_k_top_p": any(0 < p.top_k < vocab_size or p.top_p < 1 for p in params),
        "has_min_p": any(p.min_p > 0 for p in params),
    }
