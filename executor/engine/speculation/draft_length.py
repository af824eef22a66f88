"""Dynamic draft length: per request, the k that maximizes expected tokens per second.

With a per-token acceptance rate ``a`` (running estimate per request), a step with k drafts yields
``E(k) = 1 + a + ... + a^k`` tokens and costs ``C(batch tokens) / batch + k * d`` seconds per request,
where ``C(n)`` is the target's forward time over n tokens and ``d`` the drafter's time per draft token.
The policy picks ``argmax_k E(k) / cost(k)``; k = 0 (stop drafting) when no k beats plain decoding,
with a one-token probe every ``probe_interval`` steps so a request whose text turns predictable again
gets drafts back.

``C`` comes from `ForwardCostModel`: measured once on this machine for this model and dtype (mode
"auto"), or a linear guess where each extra token costs ``DEFAULT_TOKEN_COST`` of a one-token forward
(mode "acceptance").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...layers.cpu_info import cpu_key
from ...layers.measurement.measurement_cache import cached_measurement, median_seconds
from ...layers.packed_linear import PackedLinear

logger = logging.getLogger("specexec")

#: a cached curve whose smallest forward took over this many times a fresh one was measured on a busier
#: machine: it is measured again (one slower now is kept: the machine is the busier one now)
STALE_FACTOR = 1.5
DEFAULT_TOKEN_COST = 0.25  #: extra token's cost relative to a one-token forward, when not measured
MEASURED_SIZES = (1, 2, 3, 4, 8, 16, 32, 64)  #: 3 and 4: MKL's small-matrix path ends at 3 rows


@dataclass(slots=True)
class ForwardCostModel:
    """Seconds of one target forward over n new tokens, interpolated between measured sizes."""

    num_tokens: list[int]
    seconds: list[float]

    def cost(self, n: int) -> float:
        xs, ys = self.num_tokens, self.seconds
        if n <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if n <= x1:
                return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (n - xs[-1])

    @classmethod
    def linear(cls, token_cost: float = DEFAULT_TOKEN_COST) -> ForwardCostModel:
        return cls([1, 2], [1.0, 1.0 + token_cost])

    @classmethod
    def measure(cls, forward_n_tokens, sizes=MEASURED_SIZES, repeats: int = 3) -> ForwardCostModel:
        """``forward_n_tokens(n)`` runs one forward over n new tokens; the median of repeats is kept."""
        seconds = []
        for n in sizes:
            forward_n_tokens(n)  # warm-up
            seconds.append(median_seconds(lambda n=n: forward_n_tokens(n), repeats))
        return cls(list(sizes), seconds)

    @classmethod
    def cached(cls, key: str, forward_n_tokens, cache_dir: Path, sizes=MEASURED_SIZES) -> ForwardCostModel:
        def measure() -> dict:
            model = cls.measure(forward_n_tokens, sizes)
            return {"num_tokens": model.num_tokens, "seconds": model.seconds}

        def measured_on_a_busier_machine(cached: dict) -> bool:
            try:
                n, then = int(cached["num_tokens"][0]), float(cached["seconds"][0])
            except (TypeError, ValueError, IndexError, KeyError):
                return True  # not a curve: measure it
            forward_n_tokens(n)  # warm-up
            now = median_seconds(lambda: forward_n_tokens(n), 3)
            if then <= STALE_FACTOR * now:
                return False
            logger.info(
                "the cached forward cost has %.1f ms for %d tokens, %.1fx a forward now: measuring again",
                then * 1e3, n, then / now,
            )  # fmt: skip
            return True

        what = f"measuring the target's forward cost over 1..{sizes[-1]} tokens"
        needs = ("num_tokens", "seconds")
        data = cached_measurement(
            cache_dir, "forward-cost", key, measure, what, needs, measured_on_a_busier_machine
        )
        return cls(data["num_tokens"], data["seconds"])


def cost_cache_key(model: torch.nn.Module) -> str:
    param = next(model.parameters())
    num_params = sum(p.numel() for p in model.parameters())
    # quantized weights are buffers: their bytes tell an int8 model from an int4 one of the same params
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    name = getattr(model.config, "_name_or_path", "") or type(model).__name__
    # packed layers' weights are neither: their count tells a oneDNN model from the same model on BLAS,
    # their row bands one that runs only some row counts on oneDNN
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    bands = sorted({m.describe_kernels() for m in packed})
    where = cpu_key() if param.device.type == "cpu" else torch.cuda.get_device_name(param.device)
    return (
        f"{name}|{num_params}|buffers={buffer_bytes}|packed={len(packed)}|rows={bands}|{param.dtype}"
        f"|{param.device}|{where}|threads={torch.get_num_threads()}"
    )


@dataclass(slots=True)
class _Acceptance:
    rate: float  #: running per-token acceptance estimate
    steps_without_drafts: int = 0


@dataclass
class DraftLengthPolicy:
    max_draft_len: int
    cost_model: ForwardCostModel
    initial_rate: float = 0.6  #: optimistic start, so a new request drafts
    decay: float = 0.7  #: weight of the old estimate per observation
    probe_interval: int = 8  #: steps at k = 0 before a one-token probe
    _requests: dict[str, _Acceptance] = field(default_factory=dict)

    def expected_tokens(self, rate: float, k: int) -> float:
        return sum(rate**i for i in range(k + 1))

    def choose(self, request_id: str, batch_size: int, draft_cost_per_token: float = 0.0) -> int:
        state = self._requests.setdefault(request_id, _Acceptance(self.initial_rate))
        best_k, best = 0, 0.0
        for k in range(self.max_draft_len + 1):
            step_cost = self.cost_model.cost(batch_size * (1 + k)) / batch_size + k * draft_cost_per_token
            value = self.expected_tokens(state.rate, k) / step_cost
            if value > best * (1 + 1e-9):
                best_k, best = k, value
        if best_k == 0:
            state.steps_without_drafts += 1
            if state.steps_without_drafts >= self.probe_interval:
                state.steps_without_drafts = 0
                return 1
        else:
            state.steps_without_drafts = 0
        return best_k

    def observe(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        """Fold one verification into the request's acceptance estimate."""
        if num_drafts <= 0:
            return
        state = self._requests.setdefault(request_id, _Acceptance(self.initial_rate))
        # per-token rate of this step: accepted tokens over the positions that were tried
        tried = num_accepted + (1 if num_accepted < num_drafts else 0)
        observed = num_accepted / tried
        state.rate = self.decay * state.rate + (1 - self.decay) * observed

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
