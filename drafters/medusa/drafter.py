"""Medusa drafting: the heads read the target's final hidden state at the last verified position.

The verifying forward already computed that state (the executor captures ``hidden_states[num_layers]``
for the drafter): its LM head gave the step's bonus token, and head ``k`` gives the ``k``-th token after
it. So a step's drafts cost the heads alone, one batched matmul for every request and head, with no
forward of a model, no cache of the drafter's own and nothing to rewind.

Drafts are the heads' greedy tokens (deterministic: a sampled request is verified by drawing from the
target's distribution). With ``draft_tree`` the request's tree is grown best first from each head's
top tokens (`tree.py`). A guided request drafts a chain, each head's row masked by the grammar after
the drafts before it (through ``d2t``), and stops at the first row its grammar leaves no token in.
"""

from __future__ import annotations

import math
import time

import torch

from ...executor.engine.speculation.confidence_stop import ChainOdds
from ...executor.engine.speculation.tree_config import TreeShape
from ..base import Drafter, DraftProposal
from ..draft_masks import DraftMasks
from .heads import MedusaHeads
from .tree import best_first_tree


class MedusaDrafter(Drafter):
    runs_on_loop_thread = True  #: built in: one matmul a step, no thread hop (see Drafter)
    accepts_grammar_masks = True  #: a guided request's rows are masked by its grammar (through d2t)
    #: draft_len_policy "confidence": a chain ends where its head's top probability does not pay
    reports_confidence = True
    #: ``draft_tree: true``: the best-first tree over the heads' top tokens (`tree.py`)
    default_tree = TreeShape(max_nodes=8, branching=3)

    def __init__(
        self, heads: MedusaHeads, max_draft_len: int, target_vocab_size: int, num_target_layers: int
    ):
        super().__init__(max_draft_len)
        cfg = heads.config
        if cfg.vocab_size != target_vocab_size:
            raise ValueError(
                f"Medusa heads' vocabulary ({cfg.vocab_size}) differs from the target's ({target_vocab_size})"
            )
        if max_draft_len > cfg.num_heads:
            raise ValueError(
                f"Medusa: max_draft_len {max_draft_len} is more than the heads' number ({cfg.num_heads}): "
                f"each draft is one head's, so at most {cfg.num_heads} drafts a step"
            )
        self.heads = heads
        self.hidden_state_layers = (num_target_layers,)  #: the final normed hidden state
        #: (read now: the executor may repack the heads' linear layers for the CPU, weights and all)
        self.dtype, self.device = heads.dtype, heads.lm_head.weight.device
        self._masks = DraftMasks(target_vocab_size, self.device)
        #: per request: (position, the target's final hidden state there [hidden]) of the newest verified row
        self._last_rows: dict[str, tuple[int, torch.Tensor]] = {}

    def torch_modules(self) -> list[torch.nn.Module]:
        return [self.heads]

    def warm_up(self) -> None:
        with torch.inference_mode():
            self.heads(torch.zeros(1, self.heads.config.hidden_size, dtype=self.dtype, device=self.device))

    # ---- drafting -------------------------------------------------------------------------------
    def prepare_draft_tokens(self, scheduled_requests: list, resources) -> dict[str, DraftProposal]:
        ready = [(s, row) for s in scheduled_requests if (row := self._last_row(s.request)) is not None]
        if not ready:
            return {}
        depths = [min(s.max_draft_depth or s.num_draft_slots, self.heads.config.num_heads) for s, _ in ready]
        hidden = torch.stack([row for _, row in ready]).to(self.dtype)  # [R, hidden]
        started = time.perf_counter()
        with torch.inference_mode():
            logits = self.heads(hidden, max(depths)).float()  # [R, K, draft_vocab]
        if self.confidence_stop is not None:  # (one call drafts every level: its share per level)
            self.confidence_stop.time_draft_step((time.perf_counter() - started) / max(depths))
        batch_size = len(scheduled_requests)
        proposals: dict[str, DraftProposal] = {}
        plain = []
        for i, ((s, _), depth) in enumerate(zip(ready, depths)):
            grammar = self.grammar_of(s.request)
            if grammar is not None:
                proposals[s.request.request_id] = self._guided_chain(
                    logits[i, :depth], grammar.fork_for_drafting(), batch_size
                )
            else:
                plain.append((i, s, depth))
        if plain:
            proposals.update(self._unguided(logits, plain, batch_size))
        return proposals

    def _unguided(self, logits: torch.Tensor, plain: list, batch_size: int) -> dict[str, DraftProposal]:
        """Chains (the heads' greedy tokens) or, for a request given more slots than levels, trees; the
        candidates of every request come back in one read."""
        is_tree = [s.num_draft_slots > depth for _, s, depth in plain]
        branching = self.draft_tree.branching if self.draft_tree is not None and any(is_tree) else 1
        rows = logits[torch.tensor([i for i, _, _ in plain], device=logits.device)]  # [P, K, draft_vocab]
        wants_log_probs = branching > 1 or self.confidence_stop is not None
        if wants_log_probs:
            rows = rows.log_softmax(dim=-1)
        top = rows.topk(branching, dim=-1)  # [P, K, branching]
        tokens = self.heads.to_target_ids(top.indices).tolist()
        log_probs = top.values.tolist() if wants_log_probs else None
        proposals = {}
        for j, (_, s, depth) in enumerate(plain):
            rid = s.request.request_id
            if is_tree[j] and branching > 1 and log_probs is not None:
                tree_tokens, parents = best_first_tree(log_probs[j], tokens[j], s.num_draft_slots, depth)
                proposals[rid] = DraftProposal(tree_tokens, parents=parents)
                continue
            chain = [level[0] for level in tokens[j][:depth]]
            if log_probs is not None and self.confidence_stop is not None:
                chain = chain[: self._confident_length([lp[0] for lp in log_probs[j][:depth]], batch_size)]
            proposals[rid] = DraftProposal(chain)
        return proposals

    def _confident_length(self, log_probs: list[float], batch_size: int) -> int:
        """How many of a chain's drafts pay under ``confidence_stop``, each judged by its head's top
        probability (``log_probs``, one per level)."""
        odds = ChainOdds()
        for log_prob in log_probs:
            if not self.confidence_stop.keeps(odds, math.exp(log_prob), batch_size):
                break
            odds.keep(math.exp(log_prob))
        return odds.num_drafts

    def _guided_chain(self, logits: torch.Tensor, matcher, batch_size: int) -> DraftProposal:
        """The greedy chain of one guided request's head rows ``logits`` [depth, draft_vocab], each row
        masked by ``matcher`` (its own fork) after the drafts before it (and, under ``confidence_stop``,
        ended at the first draft whose masked probability does not pay)."""
        drafts: list[int] = []
        odds = ChainOdds()
        for row in logits:
            if matcher.is_terminated():
                break
            row = row[None].clone()  # [1, draft_vocab]
            self._masks.apply(row, [matcher], d2t=self.heads.d2t)
            best = int(row.argmax(dim=-1))
            if not torch.isfinite(row[0, best]):  # the grammar leaves no draft-vocabulary token
                break
            if self.confidence_stop is not None:
                confidence = float(torch.softmax(row[0], dim=-1)[best])
                if not self.confidence_stop.keeps(odds, confidence, batch_size):
                    break
                odds.keep(confidence)
            token = int(self.heads.to_target_ids(torch.tensor(best, device=row.device)))
            if not matcher.accept_token(token):
                break
            drafts.append(token)
        return DraftProposal(drafts)

    def _last_row(self, request) -> torch.Tensor | None:
        """The target's final hidden state at the request's last verified position (the one whose LM head
        gave its newest token), or None when the verifying forward did not hand it over (a request
        recomputed after preemption drafts again from its next forward)."""
        rid = request.request_id
        if request.target_hidden:
            start, rows = request.target_hidden[-1]
            # a copy, not a view: the chunk may hold a whole prompt's rows
            self._last_rows[rid] = (start + rows.shape[0] - 1, rows[-1].clone())
            request.target_hidden.clear()
        last = self._last_rows.get(rid)
        if last is None or last[0] != request.num_tokens - 2:
            return None
        return last[1]

    def release(self, request) -> None:
        self._last_rows.pop(request.request_id, None)
