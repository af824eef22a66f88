"""Verification inside the loop, fault by fault: one batched `RejectionSampler` call over the step's
flattened drafts (one request at a time if it raises), and a check of every answer.

A row whose logits hold NaN or +inf, or allow no token at all (a grammar with no way on), is *bad* and
is never read: the sampler stops a request's verification before its first bad row, and a request
whose very next token would come from a bad row fails here. (Greedy output is the same as without
drafts: the tokens before the bad row are emitted, then the request fails where it would have.) A
request whose own verification raises, or answers something impossible, fails alone.

A request whose drafts are a token tree is verified alone by the walk of `sampling/tree_verify.py`, and
its rows are then laid out as the accepted chain (`speculation/tree_drafts.py`).
"""

from __future__ import annotations

import torch

from ...sampling.rejection import RejectionSampler, Verification
from ...sampling.spec_decode_metadata import SpecDecodeMetadata
from ...sampling.tree_shape import first_branch
from ...sampling.tree_verify import verify_tree
from ..model.forward_io import ForwardOutput
from .request import RequestState
from .scheduler import ScheduledRequest
from .speculation.tree_drafts import settle_tree_rows

Faults = dict[RequestState, str]  # requests that failed in this step -> why


def flatten_drafts(batch: list[ScheduledRequest], vocab_size: int, device) -> SpecDecodeMetadata:
    """The step's chains of drafts, of every request that yields tokens (those with logit rows) and
    drafts no tree, in batch order."""
    producing = [s for s in batch if s.completes_sequence and s.draft_parents is None]
    return SpecDecodeMetadata.build(
        [s.draft_token_ids for s in producing], [s.draft_probs for s in producing], vocab_size, device
    )


class VerifyStage:
    def __init__(self, sampler: RejectionSampler, vocab_size: int) -> None:
        self.sampler = sampler
        self.vocab_size = vocab_size

    def verify(
        self,
        batch: list[ScheduledRequest],
        output: ForwardOutput,
        meta: SpecDecodeMetadata,
        masks,
        faults: Faults,
    ) -> list[Verification | None]:
        """Each producing request's verification (None for mid-prompt chunks and failed requests)."""
        producing = [i for i, s in enumerate(batch) if s.completes_sequence]
        verifications: list[Verification | None] = [None] * len(batch)
        if not producing:
            return verifications
        chains = [i for i in producing if batch[i].draft_parents is None]
        results = dict(zip(chains, self._verify_chains(batch, chains, output, meta, faults)))
        for i in producing:
            if i not in results:
                results[i] = self._verify_tree(batch[i], output, i, faults)
        for i in producing:
            v = results[i]
            s = batch[i]
            if s.request in faults or v is None:
                continue
            if isinstance(v, Verification) and v.unusable is not None:
                faults[s.request] = self._bad_row_message(v.unusable, masks, output.cu_logit_rows[i])
                continue
            problem = self._impossible(v, s)
            if problem is not None:
                faults[s.request] = f"verification returned {problem}"
                continue
            verifications[i] = v
        return verifications

    def _verify_chains(self, batch, chains: list[int], output: ForwardOutput, meta, faults) -> list:
        """The chain requests' verifications in one batched call (one at a time if it raises)."""
        if not chains:
            return []
        requests = [batch[i].request for i in chains]
        logits = output.logits
        if len(chains) < sum(s.completes_sequence for s in batch):  # trees too: the chains' rows only
            rows = [r for i in chains for r in range(output.cu_logit_rows[i], output.cu_logit_rows[i + 1])]
            logits = logits[torch.tensor(rows, device=logits.device)]
        try:
            return list(
                self.sampler.verify_batch(
                    logits, meta, [r.sampling_params for r in requests], [r.generator for r in requests]
                )
            )
        except Exception:
            return [self._verify_one(batch[i], output, i, faults) for i in chains]

    def _verify_tree(
        self, s: ScheduledRequest, output: ForwardOutput, index: int, faults: Faults
    ) -> Verification | None:
        """A token tree's walk; its rows then laid out as the accepted chain."""
        r = s.request
        try:
            rows = output.logits[output.cu_logit_rows[index] : output.cu_logit_rows[index + 1]]
            walk = verify_tree(
                rows,
                s.draft_token_ids,
                s.draft_parents,
                r.sampling_params,
                r.generator,
                self.sampler.summarize_rows,
            )
            if walk.unusable is not None:
                return Verification([], 0, walk.unusable)
            s.accepted_path = walk.path
            branch = first_branch(s.draft_parents)  # the chain the drafter would have drafted
            on_branch = 0
            while on_branch < min(len(walk.path), len(branch)) and walk.path[on_branch] == branch[on_branch]:
                on_branch += 1
            s.first_branch = (len(branch), on_branch)
            settle_tree_rows(s, output, index, walk.path)
            return Verification(walk.token_ids, walk.num_accepted)
        except Exception as exc:
            faults[r] = f"sampling failed: {type(exc).__name__}: {exc}"
            return None

    def _verify_one(
        self, s: ScheduledRequest, output: ForwardOutput, index: int, faults: Faults
    ) -> Verification | None:
        """The request at batch ``index`` verified alone (the batched call raised)."""
        r = s.request
        try:
            rows = output.logits[output.cu_logit_rows[index] : output.cu_logit_rows[index + 1]]
            return self.sampler.verify(rows, s.draft_token_ids, s.draft_probs, r.sampling_params, r.generator)
        except Exception as exc:
            if r not in faults:
                faults[r] = f"sampling failed: {type(exc).__name__}: {exc}"
            return None

    def _impossible(self, v, s: ScheduledRequest) -> str | None:
        """What is wrong with a verification, or None: accepted drafts, then one token in the vocabulary."""
        drafts = s.draft_token_ids
        if not isinstance(v, Verification) or not isinstance(v.num_accepted, int):
            return f"{type(v).__name__}, not a Verification"
        if not 0 <= v.num_accepted <= len(drafts) or len(v.token_ids) != v.num_accepted + 1:
            return f"{v.num_accepted} accepted of {len(drafts)} drafts with {len(v.token_ids)} tokens"
        if list(v.token_ids[: v.num_accepted]) != drafts[: v.num_accepted]:
            return "accepted tokens that are not the drafts"
        last = v.token_ids[-1]
        if isinstance(last, bool) or not isinstance(last, int) or not 0 <= last < self.vocab_size:
            return f"token {last!r}, outside the vocabulary"
        return None

    def _bad_row_message(self, status: str, masks, row: int) -> str:
        """Why a request's next token cannot be drawn from its first row (``status``: nan, +inf, -inf)."""
        if status == "nan":
            return "the model's logits hold NaN for its next token"
        if status == "+inf":
            return "the model's logits hold +inf for its next token"
        if masks is not None and int(masks.needs_mask[row]):
            return "the grammar admits no token next: the schema, regex or grammar has no valid continuation"
        return "every logit is -inf for its next token"
