"""Per-token draft length from the drafter's own confidence (draft_len_policy "confidence").

A model drafter knows, before it picks each draft token, how sure it is: the largest probability of
its (masked) distribution. EAGLE-2 (Li et al., arXiv 2406.16858) observed that this tracks the chance
that the target accepts the token. So a request's chain is accepted through its i-th draft with
probability about ``P_i = c_0 * ... * c_i``, and a step with k drafts yields ``E_k = 1 + P_0 + ... +
P_{k-1}`` tokens.

One more draft adds ``P_k`` tokens and costs the target's marginal forward time for one more token plus
one more drafting step. The chain grows while that marginal rate beats the step's rate so far:
``P_k * T_k > E_k * (T_{k+1} - T_k)``, where ``T_k`` is the request's share of a step in which each of
the batch's requests verifies k drafts: ``(C(batch * (1 + k)) + (k + 1) * d) / batch``, with ``C`` the
measured forward cost (`ForwardCostModel`) and ``d`` one drafting step's seconds. A chain stopped early
leaves its reserved slots unused; the target forward shrinks to what was drafted.

The confidence is read before the token is chosen (it never depends on which token a sampled draft
turns out to be), so a sampled draft stays verifiable by lossless rejection sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .draft_length import ForwardCostModel


@dataclass(slots=True)
class ChainOdds:
    """One request's chain in one step: the chance it is accepted so far, the tokens it is expected
    to yield, and its drafts so far."""

    accepted: float = 1.0  #: P of the last draft kept (1 before any)
    expected: float = 1.0  #: E: 1 (the target's own token) + the P of every draft kept
    num_drafts: int = 0

    def keep(self, confidence: float) -> None:
        self.accepted *= confidence
        self.expected += self.accepted
        self.num_drafts += 1


@dataclass
class ConfidenceStop:
    cost_model: ForwardCostModel  #: seconds of one target forward over n new tokens
    draft_step_seconds: float = 0.0  #: one drafting step (the whole batch), a running estimate
    smoothing: float = 0.8  #: weight of the old estimate per timed step
    _timed: bool = field(default=False, repr=False)

    def step_seconds(self, num_drafts: int, batch_size: int) -> float:
        """T_k: the request's share of a step where the batch verifies ``num_drafts`` drafts each."""
        forward = self.cost_model.cost(batch_size * (1 + num_drafts))
        return (forward + (num_drafts + 1) * self.draft_step_seconds) / batch_size

    def keeps(self, chain: ChainOdds, confidence: float, batch_size: int) -> bool:
        """Whether one more draft, of this confidence, raises the request's expected tokens per second."""
        gain = chain.accepted * confidence
        now = self.step_seconds(chain.num_drafts, batch_size)
        extra = self.step_seconds(chain.num_drafts + 1, batch_size) - now
        return gain * now > chain.expected * extra

    def time_draft_step(self, seconds: float) -> None:
        """Fold one drafting step's wall time into the running estimate."""
        if not self._timed:
            self.draft_step_seconds, self._timed = seconds, True
        else:
            self.draft_step_seconds = (
                self.smoothing * self.draft_step_seconds + (1 - self.smoothing) * seconds
            )
