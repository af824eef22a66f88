"""What the drafters that look drafts up in text share: one plan per step, chains scored across
indexes, and guided requests' drafts cut where their grammar refuses a token."""

from __future__ import annotations

from ..base import Drafter, DraftProposal, grammar_valid_prefix
from .suffix_index import NO_SPECULATION, Speculation, SpeculationLimits


class RetrievalDrafter(Drafter):
    """Drafts the best-scoring chain among `speculations`; subclasses say where they look."""

    is_deterministic = True
    returns_draft_probs = False
    runs_on_loop_thread = True  #: built in: bounded work, no thread hop (see Drafter)
    accepts_grammar_masks = True  #: a guided request's chain is cut at its first refused token

    def __init__(self, max_draft_len: int, limits: SpeculationLimits) -> None:
        super().__init__(max_draft_len)
        self.limits = limits
        self._planned: dict[str, tuple[int, list[int]]] = {}  #: request id -> (num tokens, drafts)

    def speculations(self, request, num_slots: int) -> list[Speculation]:
        """Each index's chain for the request (its text indexed up to now first)."""
        raise NotImplementedError

    def _choose(self, request, num_slots: int) -> list[int]:
        grammar = self.grammar_of(request)
        best = NO_SPECULATION
        for found in self.speculations(request, num_slots):
            if grammar is not None and found.token_ids:
                keep = grammar_valid_prefix(grammar, found.token_ids)
                found = Speculation(found.token_ids[:keep], found.probs[:keep], found.match_len)
            if found.score > best.score:
                best = found
        return best.token_ids

    def num_draft_slots(self, request) -> int:
        """Exactly as many slots as the chosen chain has drafts: 0 when nothing matches."""
        drafts = self._choose(request, self.max_draft_len)
        self._planned[request.request_id] = (len(request.token_ids), drafts)
        return len(drafts)

    def propose(self, request, num_slots: int, resources=None) -> DraftProposal:
        planned = self._planned.pop(request.request_id, None)
        if planned is not None and planned[0] == len(request.token_ids):
            drafts = planned[1]
        else:
            drafts = self._choose(request, num_slots)
        return DraftProposal(list(drafts[: max(0, num_slots)]))

    def release(self, request) -> None:
        self._planned.pop(request.request_id, None)
