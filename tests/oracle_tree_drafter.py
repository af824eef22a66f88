"""A drafter that knows the greedy output and proposes trees whose true branch is never the first."""

from __future__ import annotations

import random

from specexec.drafters.base import Drafter, DraftProposal
from specexec.executor.engine.speculation.tree_config import TreeShape


class OracleTreeDrafter(Drafter):
    """Per level: a garbage node (the first branch), the true token, and a node that is right once then
    garbage; laid out level by level, so the true branch's nodes are never at the chain's slots."""

    runs_on_loop_thread = True
    default_tree = TreeShape(max_nodes=12, branching=3)

    def __init__(self, expected: dict[str, list[int]], vocab: int, max_draft_len: int = 4) -> None:
        super().__init__(max_draft_len)
        self.expected = expected
        self.vocab = vocab
        self.rng = random.Random(0)
        self.num_trees = 0

    def prepare_draft_tokens(self, scheduled_requests, resources):
        return {s.request.request_id: self._tree(s) for s in scheduled_requests}

    def _garbage(self, avoid: int) -> int:
        return self.rng.choice([t for t in range(self.vocab) if t != avoid])

    def _tree(self, s) -> DraftProposal:
        r = s.request
        truth = self.expected[r.request_id][r.num_output_tokens :]
        depth = min(s.max_draft_depth or s.num_draft_slots, len(truth))
        tokens, parents = [], []
        ends = {"garbage": -1, "true": -1, "half": -1}  # each branch's last node
        for level in range(depth):
            for branch in ("garbage", "true", "half"):
                if len(tokens) >= s.num_draft_slots:
                    break
                right = branch == "true" or (branch == "half" and level == 0)
                tokens.append(truth[level] if right else self._garbage(truth[level]))
                parents.append(ends[branch])
                ends[branch] = len(tokens) - 1
        self.num_trees += 1
        return DraftProposal(tokens, parents=parents)
