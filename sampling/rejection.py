"""Verification step of speculative decoding: which draft tokens the target keeps, and what comes next.

`RejectionSampler.verify` is the whole algorithm in one function, read top to bottom. The words
*accepted*, *recovered* and *bonus* are defined once, in the `RejectionSampler` docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .logits import compute_probs
from .params import SamplingParams
from .sampler import sample_from_probs

#: Token id that stands for "no token" where a slot must be filled; a valid vocabulary id never equals it,
#: so a draft carrying it is rejected like any other out-of-vocabulary draft and it is never emitted.
PLACEHOLDER_TOKEN_ID = -1


@dataclass(slots=True)
class Verification:
    """What one request gets out of one verifying forward."""

    token_ids: list[int]  #: accepted draft tokens, then one recovered or bonus token (len = num_accepted + 1)
    num_accepted: int  #: draft tokens accepted (0..k)


class RejectionSampler:
    """Verifies draft tokens against the target model (Leviathan et al., arXiv 2211.17192).

    The drafter proposes k tokens d_0..d_{k-1}; one target forward gives k + 1 rows of logits: row i
    scores the position of d_i, row k the position after the last draft. Verification walks the
    drafts in order and emits ``num_accepted + 1`` tokens:

    - *accepted* tokens: draft tokens the target keeps (a prefix of the drafts, 0..k of them);
    - the *recovered* token: emitted at the first rejected position i instead of d_i, drawn from the
      residual distribution norm(max(p_i - q_i, 0)) (with deterministic drafts, q_i is a point mass
      on d_i and the residual is p_i with d_i removed; greedy takes the target's argmax);
    - the *bonus* token: drawn from the target's last row p_k after all k drafts were accepted.

    Here p_i is the target's distribution at row i (after temperature, top-k, top-p and min-p) and
    q_i the drafter's. With temperature > 0 the emitted tokens are distributed exactly as if the
    target had sampled them one by one (the rule is lossless); with temperature 0 they are exactly
    the target's greedy tokens.
    """

    def verify(
        self,
        target_logits: Tensor,
        draft_token_ids: list[int],
        draft_probs: Tensor | None,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Verification:
        """Accepted drafts plus one recovered or bonus token for one request.

        target_logits [k + 1, vocab]: the target's logits at the k draft positions and the one after.
        draft_token_ids [k] (k may be 0: then this just samples one token from row 0).
        draft_probs [k, vocab]: the drafter's distribution q, or None for deterministic drafts.
        generator: the request's generator for every random draw (None = the global RNG).
        """
        k = len(draft_token_ids)
        num_rows, vocab = target_logits.shape
        if num_rows != k + 1:
            raise ValueError(f"need k + 1 = {k + 1} target rows for {k} draft tokens, got {num_rows}")
        if draft_probs is not None and tuple(draft_probs.shape) != (k, vocab):
            raise ValueError(
                f"draft_probs must be [k, vocab] = [{k}, {vocab}], got {list(draft_probs.shape)}"
            )

        # Greedy (temperature 0): accept while the draft equals the target's argmax; at the first
        # mismatch emit that argmax (recovered); if all are accepted emit the last row's argmax (bonus).
        # The argmax is taken on the raw logits, so float64 logits give an exact argmax.
        if params.is_greedy:
            return _accept_greedy(draft_token_ids, target_logits.argmax(dim=-1).tolist())

        # Temperature > 0: p_i = the target's probabilities at row i with this request's temperature,
        # top-k, top-p and min-p. The filters are applied to p before verification, so a filtered
        # token can never be emitted (p_i is 0 there: it is never accepted, recovered or a bonus).
        device = target_logits.device
        p = compute_probs(  # [k + 1, vocab] float32
            target_logits,
            torch.full((num_rows,), params.temperature, dtype=torch.float32, device=device),
            torch.full((num_rows,), params.top_k, dtype=torch.long, device=device),
            torch.full((num_rows,), params.top_p, dtype=torch.float32, device=device),
            torch.full((num_rows,), params.min_p, dtype=torch.float32, device=device),
        )

        # With q: read p_i[d_i] and q_i[d_i] for every draft, and draw one u_i ~ U(0, 1) per draft,
        # all with one host sync. Out-of-vocabulary drafts read column 0 here; they never use it.
        if draft_probs is not None and k:
            q = draft_probs.to(device=device, dtype=torch.float32)  # [k, vocab]
            ids = torch.tensor(draft_token_ids, dtype=torch.long, device=device).clamp(0, vocab - 1)  # [k]
            p_draft = p[:k].gather(1, ids[:, None]).squeeze(1)  # [k]
            q_draft = q.gather(1, ids[:, None]).squeeze(1)  # [k]
            uniforms = torch.rand(k, generator=generator, device=device)  # [k]
            p_draft_list, q_draft_list, u_list = torch.stack([p_draft, q_draft, uniforms]).tolist()

        accepted: list[int] = []
        for i, d in enumerate(draft_token_ids):
            # A draft id outside [0, vocab) must never be emitted: it is rejected at this position,
            # and the emitted token is a fresh draw from p_i.
            if not 0 <= d < vocab:
                return Verification(accepted + [sample_from_probs(p[i], generator)], i)

            if draft_probs is None:
                # Deterministic drafts (no q): sample x_i ~ p_i and accept while x_i == d_i; at the
                # first mismatch emit x_i. Each emitted token is then a plain draw from p_i, so this
                # is lossless and needs no q.
                x = sample_from_probs(p[i], generator)
                if x == d:
                    accepted.append(d)
                    continue
                return Verification(accepted + [x], i)

            # Drafts with q (d_i ~ q_i): accept d_i with probability min(1, p_i[d_i] / q_i[d_i]).
            p_d, q_d, u = p_draft_list[i], q_draft_list[i], u_list[i]
            if not q_d > 0:
                # q_i[d_i] == 0 (or NaN): the drafter claims it could not have proposed d_i, so the
                # ratio means nothing. Reject, and emit a fresh draw from p_i.
                return Verification(accepted + [sample_from_probs(p[i], generator)], i)
            if u < p_d / q_d:
                accepted.append(d)
                continue
            # Rejected: the recovered token ~ norm(max(p_i - q_i, 0)), which supplies exactly the mass
            # of p_i that acceptance could not. If that residual is all zero (p_i <= q_i everywhere,
            # i.e. p_i == q_i up to rounding), fall back to p_i.
            residual = (p[i] - q[i]).clamp_min(0)  # [vocab]; sample_from_probs normalises
            recovered = sample_from_probs(residual if bool(residual.sum() > 0) else p[i], generator)
            return Verification(accepted + [recovered], i)

        # All k drafts accepted: the bonus token ~ p_k, from the row after the last draft.
        return Verification(accepted + [sample_from_probs(p[k], generator)], k)

    def verify_batch(
        self,
        target_logits: Tensor,
        cu_rows: list[int],
        drafts: list[list[int]],
        draft_probs: list[Tensor | None],
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> list[Verification]:
        """`verify` for every request of a batch; one Verification per request, in order.

        Rows of request i are ``target_logits[cu_rows[i]:cu_rows[i + 1]]`` (len(drafts[i]) + 1 of them).
        Greedy requests share ONE argmax over all rows of the batch (one host sync), then only compare
        lists; sampled requests call `verify` one by one.
        """
        n = len(drafts)
        if not len(cu_rows) == n + 1 == len(draft_probs) + 1 == len(params) + 1 == len(generators) + 1:
            raise ValueError(
                f"need cu_rows of length n + 1 and one draft list, draft_probs, SamplingParams and "
                f"generator per request: {len(cu_rows)} cu_rows, {n} drafts, {len(draft_probs)} draft_probs, "
                f"{len(params)} params, {len(generators)} generators"
            )
        for i in range(n):
            if cu_rows[i + 1] - cu_rows[i] != len(drafts[i]) + 1:
                raise ValueError(
                    f"request {i}: {len(drafts[i])} draft tokens need {len(drafts[i]) + 1} rows, "
                    f"cu_rows gives {cu_rows[i + 1] - cu_rows[i]}"
                )

        argmax = target_logits.argmax(dim=-1).tolist() if any(p.is_greedy for p in params) else []
        results = []
        for i in range(n):
            rows = slice(cu_rows[i], cu_rows[i + 1])
            if params[i].is_greedy:
                results.append(_accept_greedy(drafts[i], argmax[rows]))
            else:
                results.append(
                    self.verify(target_logits[rows], drafts[i], draft_probs[i], params[i], generators[i])
                )
        return results


def _accept_greedy(draft_token_ids: list[int], target_argmax: list[int]) -> Verification:
    """Greedy rule: accept while draft == argmax; then the argmax at the first mismatch (or the last row).

    target_argmax has len(draft_token_ids) + 1 entries, all in [0, vocab), so an out-of-vocabulary
    draft never matches: it is rejected and the target's argmax is emitted in its place.
    """
    n = 0
    while n < len(draft_token_ids) and draft_token_ids[n] == target_argmax[n]:
        n += 1
    return Verification(draft_token_ids[:n] + [target_argmax[n]], n)
