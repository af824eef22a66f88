"""Dynamic draft length: per step, the drafts per request that maximize the batch's expected tokens
per second.

Each request keeps a running acceptance rate per draft position ``a_i`` (the chance that draft i is
accepted when every draft before it was). Its i-th draft adds ``a_1 * ... * a_i`` expected tokens. A
step with ``num_drafts`` drafts over a batch of B requests costs ``C(B + num_drafts) + num_drafts * d``
seconds, where ``C(n)`` is the target's forward time over n tokens and ``d`` the drafter's time per
draft token (with a measured decode step of B sequences ``D(B)``: ``D(B) + C(B + num_drafts) - C(B)``,
`ForwardCostModel.step_cost`). The policy (`DraftLengthPolicy.choose`) gives the drafts to the largest
gains and takes the total that maximizes tokens per second; no drafts when none beats plain decoding,
with a one-token probe every ``probe_interval`` steps so a request whose text turns predictable again
gets drafts back.

``C`` comes from `ForwardCostModel`: measured once on this machine for this model and dtype by the
kernel plan (`kernel_plan/forward_cost.py`, mode "auto"), or a linear guess where each extra token costs ``DEFAULT_TOKEN_COST`` of a one-token forward
(mode "acceptance").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

logger = logging.getLogger("specexec")

DEFAULT_TOKEN_COST = 0.25  #: extra token's cost relative to a one-token forward, when not measured
#: a probing draft may cost at most about this share of a one-token forward per step: a drafter whose
#: draft costs more probes that many times less often (LayerSkip's draft is most of a forward)
PROBE_COST_SHARE = 0.1


@dataclass(slots=True)
class ForwardCostModel:
    """Seconds of one target forward over n new tokens of one sequence, interpolated between measured
    sizes; and, where measured, of one decode step of b sequences (one new token each).

    A step of b sequences with d drafts in all costs ``decode(b) + cost(b + d) - cost(b)``: the extra rows
    at one sequence's price. The decode step of b sequences costs more than one sequence's forward over b
    tokens (each sequence attends over its own context; at 8 requests here 1.6x more), so without it the
    drafts' share of a batch's step is overestimated."""

    num_tokens: list[int]
    seconds: list[float]
    batch_sizes: list[int] = field(default_factory=list)  #: decode steps measured: sequences in the batch
    batch_seconds: list[float] = field(default_factory=list)  #: [len(batch_sizes)] seconds of each

    def cost(self, n: int) -> float:
        return _interpolate(self.num_tokens, self.seconds, n)

    def step_cost(self, batch_size: int, num_drafts: int) -> float:
        """Seconds of a step of ``batch_size`` decoding sequences verifying ``num_drafts`` drafts in all."""
        if not self.batch_sizes:
            return self.cost(batch_size + num_drafts)
        decode = _interpolate(self.batch_sizes, self.batch_seconds, batch_size)
        return decode + self.cost(batch_size + num_drafts) - self.cost(batch_size)

    @classmethod
    def linear(cls, token_cost: float = DEFAULT_TOKEN_COST) -> ForwardCostModel:
        return cls([1, 2], [1.0, 1.0 + token_cost])


def _interpolate(xs: list[int], ys: list[float], n: int) -> float:
    """ys at n, linear between the points, clamped below the first and extrapolated past the last."""
    if n <= xs[0] or len(xs) == 1:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if n <= x1:
            return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return ys[-1] + slope * (n - xs[-1])


@dataclass(slots=True)
class _Acceptance:
    #: [max_draft_len] running estimate of P(draft i accepted | every draft before it accepted)
    rates: list[float]
    steps_without_drafts: int = 0


@dataclass
class DraftLengthPolicy:
    """Each step's draft length per request, chosen for the whole batch at once.

    A request's i-th draft adds ``P(drafts 1..i all accepted)`` expected tokens: the product of its
    per-position acceptance rates up to i. For ``num_drafts`` drafts in all, the batch's expected
    tokens are largest when they go to the largest of these gains (a request's gains only fall with
    i, so taking the largest keeps each request's drafts a prefix). The policy takes the total that
    maximizes ``expected tokens / (step_cost(batch, num_drafts) + num_drafts * d)``: on a cost curve
    that climbs steeply with rows (a compute-bound kernel, a big batch) few or no drafts pay.
    """

    max_draft_len: int
    cost_model: ForwardCostModel
    initial_rate: float = 0.6  #: optimistic start, so a new request drafts
    decay: float = 0.7  #: weight of the old estimate per observation
    probe_interval: int = 8  #: steps at k = 0 before a one-token probe
    _requests: dict[str, _Acceptance] = field(default_factory=dict)

    def expected_tokens(self, request_id: str, num_drafts: int) -> float:
        """Tokens one step yields for this request with num_drafts drafts: 1 + sum of the gains."""
        return 1.0 + sum(self._gains(self._state(request_id), num_drafts))

    def choose(
        self, max_drafts: dict[str, int], batch_size: int, draft_cost_per_token: float = 0.0
    ) -> dict[str, int]:
        """Draft lengths (0..max_drafts[id]) for one step of ``batch_size`` rows, the requests in
        ``max_drafts`` among them; ``draft_cost_per_token`` in the cost model's units."""
        chosen, _ = self.plan(max_drafts, batch_size, draft_cost_per_token)
        return self.with_probes(chosen, max_drafts, draft_cost_per_token)

    def plan(
        self,
        max_drafts: dict[str, int],
        batch_size: int,
        draft_cost_per_token: float = 0.0,
        rows_per_level: int = 1,
        sibling_hit: float | None = None,
    ) -> tuple[dict[str, int], float]:
        """The lengths `choose` takes before probes, and the expected tokens per unit of time they give.
        For token trees (``sibling_hit``: the chance that a level's other nodes hold the target's token
        when the chain's node there does not) a length is a depth, each level ``rows_per_level`` rows."""
        gains = []  # (expected tokens this draft adds, request id) of every draft that could be proposed
        for request_id, num_slots in max_drafts.items():
            state = self._state(request_id)
            n = min(num_slots, self.max_draft_len)
            gains += [(gain, request_id) for gain in self._gains(state, n, sibling_hit)]
        gains.sort(key=lambda item: -item[0])  # stable: a request's equal gains stay in position order
        best_total, best = 0, batch_size / self.cost_model.step_cost(batch_size, 0)
        expected = float(batch_size)
        for total, (gain, _) in enumerate(gains, start=1):
            expected += gain
            rows = total * rows_per_level
            value = expected / (self.cost_model.step_cost(batch_size, rows) + rows * draft_cost_per_token)
            if value > best * (1 + 1e-9):
                best_total, best = total, value
        chosen = dict.fromkeys(max_drafts, 0)
        for _, request_id in gains[:best_total]:
            chosen[request_id] += 1
        return chosen, best

    def with_probes(
        self, chosen: dict[str, int], max_drafts: dict[str, int], draft_cost_per_token: float = 0.0
    ) -> dict[str, int]:
        """``chosen`` with a one-draft probe for each request whose turn it is (see `_probed`)."""
        unit = PROBE_COST_SHARE * self.cost_model.cost(1)
        interval = self.probe_interval * max(1.0, draft_cost_per_token / unit if unit > 0 else 1.0)
        return {
            request_id: self._probed(request_id, n, max_drafts[request_id], interval)
            for request_id, n in chosen.items()
        }

    def _probed(self, request_id: str, num_drafts: int, num_slots: int, interval: float) -> int:
        """A one-token probe after ``interval`` steps without drafts (``probe_interval``, longer for a
        drafter whose draft is dear), so a request whose text turns predictable again gets drafts back."""
        state = self._requests[request_id]
        if num_drafts or not num_slots:
            state.steps_without_drafts = 0
            return num_drafts
        state.steps_without_drafts += 1
        if state.steps_without_drafts < interval:
            return 0
        state.steps_without_drafts = 0
        return 1

    def observe(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        """Fold one verification into the request's estimates: each position tried (the accepted ones
        and the first rejected one) moves towards 1 if accepted, else 0; later ones were not tried."""
        if num_drafts <= 0:
            return
        rates = self._state(request_id).rates
        num_tried = min(num_accepted + (1 if num_accepted < num_drafts else 0), len(rates))
        for i in range(num_tried):
            rates[i] = self.decay * rates[i] + (1 - self.decay) * float(i < num_accepted)

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def _state(self, request_id: str) -> _Acceptance:
        if request_id not in self._requests:
            self._requests[request_id] = _Acceptance([self.initial_rate] * self.max_draft_len)
        return self._requests[request_id]

    @staticmethod
    def _gains(state: _Acceptance, num_drafts: int, sibling_hit: float | None = None) -> list[float]:
        """Expected tokens each draft (or tree level) adds: the chain's P(drafts 1..i all accepted); a
        tree's level also when the chain's node there is rejected and another node holds the token."""
        gains, chain = [], 1.0
        for rate in state.rates[:num_drafts]:
            before, chain = chain, chain * rate
            gains.append(chain if sibling_hit is None else chain + before * (1 - rate) * sibling_hit)
        return gains
