"""How often prompt lookup's drafts are accepted: the confidence a text draft carries in a chain.

Under ``draft_len_policy: confidence`` each draft is kept while its chance of acceptance pays for one
more verified row (`executor/engine/speculation/confidence_stop.py`). For the head's own drafts that chance is the head's
confidence. A text draft (prompt lookup, `Eagle3Drafter`) is taken exactly where the head is unsure, so
the head's confidence says little about it: a request that copies its prompt has its text drafts
accepted far more often than the head's low confidence suggests. This counts, per request, how many
of its text drafts the target judged and how many it accepted, and estimates the chance of the next one
from that, pulled toward the rate over all requests while a request has few judged drafts.

A draft is *judged* when every draft before it in its chain was accepted (the target saw it), and
*accepted* when it was accepted too.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class _Counts:
    judged: int = 0
    accepted: int = 0

    def add(self, judged: int, accepted: int) -> None:
        self.judged += judged
        self.accepted += accepted


@dataclass
class TextOdds:
    #: how many judged drafts the rate over all requests counts for in a request's estimate
    prior_weight: float = 4.0
    _all: _Counts = field(default_factory=_Counts)
    _requests: dict[str, _Counts] = field(default_factory=dict)
    _last_chain: dict[str, list[bool]] = field(default_factory=dict)  # per draft: did it come from text

    def estimate(self, request_id: str) -> float:
        """The chance that the request's next text draft is accepted, given its chain so far is."""
        overall = (self._all.accepted + 1) / (self._all.judged + 2)  # Laplace: 0.5 before any evidence
        own = self._requests.get(request_id, _Counts())
        return (own.accepted + self.prior_weight * overall) / (own.judged + self.prior_weight)

    def record_chain(self, request_id: str, from_text: list[bool]) -> None:
        """The drafts proposed to the request this step: which of them came from its text."""
        if any(from_text):
            self._last_chain[request_id] = list(from_text)
        else:
            self._last_chain.pop(request_id, None)

    def observe(self, request_id: str, num_accepted: int) -> None:
        """After verification: count the text drafts of the request's last chain the target judged."""
        chain = self._last_chain.pop(request_id, None)
        if not chain:
            return
        judged = sum(chain[: num_accepted + 1])  # drafts up to and including the first rejected one
        accepted = sum(chain[:num_accepted])
        self._requests.setdefault(request_id, _Counts()).add(judged, accepted)
        self._all.add(judged, accepted)

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        self._last_chain.pop(request_id, None)
