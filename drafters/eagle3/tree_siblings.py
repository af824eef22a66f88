"""EAGLE-3's token trees: the chain the head drafts, and beside each of its nodes the head's next-best
tokens at that depth as leaves (a static "chain with runners-up" tree, no extra head forward).

The head's top-1 is right about 4 times in 10 on Spec-Bench; when the chain's token at a depth is
rejected, the target's token is often the head's second or third choice there, and a leaf holding it
is accepted instead. Each level gets up to ``branching - 1`` leaves, the first levels first, within the
step's node budget after one node per level for the chain. A guided request, or one whose drafts are
sampled (q), drafts its chain alone. The tree is a function of the context, so the walk over it is
lossless (`sampling/tree_verify.py`).
"""

from __future__ import annotations

import torch

from ..base import DraftProposal


class TreeSiblings:
    """One drafting call's runners-up per request, level by level."""

    def __init__(self, shape, scheduled_requests: list) -> None:
        self.branching = shape.branching
        #: per request: leaves still allowed (its node budget less one node per level of its chain)
        self.budget = {
            s.request.request_id: max(0, s.num_draft_slots - (s.max_draft_depth or s.num_draft_slots))
            for s in scheduled_requests
        }
        self.levels: dict[str, list[list[int]]] = {rid: [] for rid in self.budget}

    def add_level(self, logits: torch.Tensor, requests: list, chosen: list, matchers: list, head) -> None:
        """The runners-up of this drafting step: logits [R, draft_vocab] of ``requests``, the token each
        drafts (None: its chain ends) and its grammar matcher (guided: no leaves)."""
        wanted = [
            i
            for i, (r, token, matcher) in enumerate(zip(requests, chosen, matchers))
            if token is not None and matcher is None and self.budget[r.request_id] > 0
        ]
        if not wanted:
            for r, token in zip(requests, chosen):
                if token is not None:
                    self.levels[r.request_id].append([])
            return
        rows = logits[torch.tensor(wanted, device=logits.device)]  # [W, draft_vocab]
        top = head.to_target_ids(rows.topk(self.branching, dim=-1).indices).tolist()  # [W, branching]
        top_of = dict(zip(wanted, top))
        for i, (r, token) in enumerate(zip(requests, chosen)):
            if token is None:
                continue
            rid = r.request_id
            leaves = [t for t in top_of.get(i, []) if t != token][: min(self.branching - 1, self.budget[rid])]
            self.budget[rid] -= len(leaves)
            self.levels[rid].append(leaves)

    def has_leaves(self, rid: str) -> bool:
        return any(self.levels[rid])

    def proposal(self, rid: str, chain: list[int]) -> DraftProposal:
        """The tree: level by level, the chain's node, then its leaves (children of the node above)."""
        tokens: list[int] = []
        parents: list[int] = []
        above = -1
        for depth, token in enumerate(chain):
            leaves = self.levels[rid][depth] if depth < len(self.levels[rid]) else []
            node = len(tokens)
            tokens.append(token)
            parents.append(above)
            for leaf in leaves:
                tokens.append(leaf)
                parents.append(above)
            above = node
        return DraftProposal(tokens, parents=parents)
