"""Verification step of speculative decoding: which draft tokens the target keeps, and what comes next.

`rejection_sample` is the whole algorithm, vectorised over every draft of a step (gpt-fast's
``speculative_decode`` and vLLM's rejection sampler are the models): accept masks for all drafts at once,
the first rejection per request by a cumulative product, one draw per request for the token after, and
one host transfer of the answers. The words *accepted*, *recovered* and *bonus* are defined once, in the
`RejectionSampler` docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .host_values import device_tensor
from .logits import compute_probs
from .params import SamplingParams, filter_flags
from .sampler import draw_token
from .spec_decode_metadata import SpecDecodeMetadata

#: Token id that stands for "no token" where a slot must be filled; a valid vocabulary id never equals it,
#: so a draft carrying it is rejected like any other out-of-vocabulary draft and it is never emitted.
PLACEHOLDER_TOKEN_ID = -1


@dataclass(slots=True)
class Verification:
    """What one request gets out of one verifying forward."""

    token_ids: list[int]  #: accepted draft tokens, then one recovered or bonus token (len = num_accepted + 1)
    num_accepted: int  #: draft tokens accepted (0..k)
    unusable: str | None = (
        None  #: why its first row could not be read ("nan", "+inf", "-inf"); no tokens then
    )


#: what column 0 of `rejection_sample`'s answer says about a request's first row
ROW_STATUS = {0: None, 1: "nan", 2: "+inf", 3: "-inf"}

#: logits [rows, vocab] -> [rows, 2] long: each row's status (`ROW_STATUS`'s key) and argmax (the first
#: index of its max). The executor passes a faster one where it has it (a C++ op on the CPU).
RowSummary = Callable[[Tensor], Tensor]


def row_summary(logits: Tensor) -> Tensor:  # [rows, vocab] -> [rows, 2] long
    """Each row's status and argmax from torch's max: one pass over the rows (amax + argmax read them
    twice, and argmax over bfloat16 rows is 4x slower than max on a CPU)."""
    row_max, row_argmax = logits.max(dim=-1)  # [rows] each
    return torch.stack([_row_status(row_max), row_argmax], dim=1)


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

    Rows that cannot be read (NaN, +inf, or every logit -inf: a grammar with no way on) are never
    used: a request's drafts are cut so that verification stops before its first such row (draft j
    needs rows 0..j + 1), and a request whose first row is one gets no tokens and says why.

    ``summarize_rows``: how each row's status and argmax are found (`RowSummary`; torch's max by default).
    """

    def __init__(self, summarize_rows: RowSummary = row_summary) -> None:
        self.summarize_rows = summarize_rows

    def verify(
        self,
        target_logits: Tensor,
        draft_token_ids: list[int],
        draft_probs: Tensor | None,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Verification:
        """Accepted drafts plus one recovered or bonus token for one request (a batch of one).

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
        meta = SpecDecodeMetadata.build([list(draft_token_ids)], [draft_probs], vocab, target_logits.device)
        return self.verify_batch(target_logits, meta, [params], [generator])[0]

    def verify_batch(
        self,
        target_logits: Tensor,
        meta: SpecDecodeMetadata,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> list[Verification]:
        """One Verification per request of ``meta``, in order, with one host transfer.

        target_logits [num_drafts + batch, vocab]: each request's ``k_i + 1`` rows, request after request
        (``meta.logits_indices``)."""
        n = meta.batch_size
        if not len(params) == n == len(generators):
            raise ValueError(
                f"need one SamplingParams and one generator per request: {n} requests, "
                f"{len(params)} params, {len(generators)} generators"
            )
        if target_logits.shape[0] != meta.cu_rows[-1]:
            raise ValueError(
                f"{sum(meta.num_draft_tokens)} drafts of {n} requests need {meta.cu_rows[-1]} rows, "
                f"got {target_logits.shape[0]}"
            )
        if n == 0:
            return []
        answers, rewinds = rejection_sample(target_logits, meta, params, generators, self.summarize_rows)
        results = []
        for i, (status, *tokens) in enumerate(answers.tolist()):  # the one transfer
            emitted = [t for t in tokens if t != PLACEHOLDER_TOKEN_ID]
            if i in rewinds:
                rewinds[i].to_emitted(len(emitted))
            if ROW_STATUS[status] is not None:
                results.append(Verification([], 0, ROW_STATUS[status]))
                continue
            results.append(Verification(emitted, len(emitted) - 1))
        return results


@dataclass(slots=True)
class RngRewind:
    """A generator's states after each of a request's draws: after the host learns how many tokens came
    out (n + 1), the generator is set to the state after n + 1 draws."""

    generator: torch.Generator | None  #: None: the global generator of ``device``
    device: torch.device
    states: list[Tensor]  #: [before any draw, after draw 0, ..., after draw k]

    def to_emitted(self, num_emitted: int) -> None:
        if num_emitted + 1 < len(self.states):
            _set_rng_state(self.generator, self.device, self.states[num_emitted])


def rejection_sample(
    logits: Tensor,  # [num_drafts + batch, vocab] each request's rows (see SpecDecodeMetadata)
    meta: SpecDecodeMetadata,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    summarize_rows: RowSummary = row_summary,
) -> tuple[Tensor, dict[int, RngRewind]]:
    """Every request's verification on the device, without reading anything back.

    Returns [batch, 2 + max_spec_len] long (row status, then the emitted tokens, -1 = none) and, for
    sampled requests with deterministic drafts, how to rewind their generator once the host knows how
    many tokens each emitted. A request's random draws are its own, so a seeded request gives the same
    tokens alone or in any batch; with deterministic drafts they are also the very draws plain sampling
    makes (one per emitted token)."""
    batch, width = meta.batch_size, meta.max_spec_len
    device = logits.device
    sampled = [i for i, p in enumerate(params) if not p.is_greedy]
    if width == 0 and not sampled:  # greedy decode rows only: each request's status and argmax
        return summarize_rows(logits)[meta.padded_rows[:, 0]], {}
    drafts = meta.padded_draft_ids  # [batch, K]
    rows = meta.padded_rows  # [batch, K + 1]
    positions = torch.arange(width, device=device)  # [K]
    num_drafts = meta.cu_num_draft_tokens[1:] - meta.cu_num_draft_tokens[:-1]  # [batch]
    in_range = positions[None, :] < num_drafts[:, None]  # [batch, K]

    # Rows that can be read: draft j is usable only while rows 0..j + 1 all are.
    summary = summarize_rows(logits)[rows]  # [batch, K + 1, 2]: each row's status and argmax
    row_ok = summary[..., 0] == 0  # [batch, K + 1]
    ok_prefix = row_ok.long().cumprod(dim=1).bool()  # [batch, K + 1]
    usable = in_range & ok_prefix[:, 1:]  # [batch, K]
    num_usable = usable.sum(dim=1)  # [batch]
    status = summary[:, 0, 0]  # [batch]

    # Greedy: accept while the draft is the target's argmax (on the raw logits: float64 stays exact).
    argmax = summary[..., 1]  # [batch, K + 1]
    accept = drafts == argmax[:, :width]  # [batch, K]
    final = argmax  # [batch, K + 1]: the token emitted after n accepted drafts is final[n]
    rewinds: dict[int, RngRewind] = {}

    if sampled:
        accept, final = accept.clone(), final.clone()
        p = _target_probs(logits, meta, params, sampled)  # [S, K + 1, vocab]
        with_q = [(row, i) for row, i in enumerate(sampled) if meta.has_draft_probs[i]]
        without_q = [(row, i) for row, i in enumerate(sampled) if not meta.has_draft_probs[i]]
        if with_q:
            _verify_with_q(p, meta, generators, with_q, accept, final, num_usable)
        for row, i in without_q:
            rewinds[i] = _verify_without_q(p[row], meta, generators[i], i, accept, final)

    accept &= usable
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)  # [batch]
    out = torch.full((batch, width + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=device)
    out[:, :width] = torch.where(positions[None, :] < num_accepted[:, None], drafts, PLACEHOLDER_TOKEN_ID)
    out.scatter_(1, num_accepted[:, None], final.gather(1, num_accepted[:, None]))
    return torch.cat([status[:, None], out], dim=1), rewinds


def _row_status(row_max: Tensor) -> Tensor:  # [rows] each row's max -> [rows] long
    """`ROW_STATUS`'s key of each row: 0 a readable row, 1 NaN, 2 +inf, 3 all -inf."""
    return torch.where(
        torch.isfinite(row_max), 0, torch.where(row_max.isnan(), 1, torch.where(row_max > 0, 2, 3))
    )


def _target_probs(logits, meta: SpecDecodeMetadata, params, sampled: list[int]) -> Tensor:
    """p: the target's filtered distribution on every row of the sampled requests, [S, K + 1, vocab]."""
    width, device = meta.max_spec_len, logits.device
    index = device_tensor(sampled, torch.long, device)  # [S]

    def per_row(values, dtype):
        return device_tensor(values, dtype, device).repeat_interleave(width + 1)

    chosen = [params[i] for i in sampled]
    probs = compute_probs(  # [S * (K + 1), vocab] float32
        logits[meta.padded_rows[index].reshape(-1)],
        per_row([x.temperature for x in chosen], torch.float32),
        per_row([x.top_k for x in chosen], torch.long),
        per_row([x.top_p for x in chosen], torch.float32),
        per_row([x.min_p for x in chosen], torch.float32),
        **filter_flags(chosen, logits.shape[-1]),
    )
    # an unreadable row (its request is cut before it, or fails) still needs something to draw from
    drawable = torch.isfinite(probs).all(dim=1, keepdim=True) & (probs.sum(dim=1, keepdim=True) > 0)
    return torch.where(drawable, probs, 1.0).view(len(sampled), width + 1, -1)


def _verify_without_q(p, meta, generator, i: int, accept, final) -> RngRewind:
    """Deterministic drafts (q a point mass on d_j): draw x_j ~ p_j for every row, accept while x_j ==
    d_j, and emit x_n at the first mismatch (or the last row). Each emitted token is a plain draw from
    p_j, so this is lossless, needs no q, and (after the rewind) uses the draws plain sampling would."""
    device = p.device
    k = meta.num_draft_tokens[i]
    states = [_rng_state(generator, device)]
    draws = []
    for j in range(k + 1):  # p: [K + 1, vocab]
        draws.append(draw_token(p[j], generator))
        states.append(_rng_state(generator, device))
    x = torch.cat(draws)  # [k + 1]
    accept[i, :k] = x[:k] == meta.padded_draft_ids[i, :k]
    final[i, : k + 1] = x
    return RngRewind(generator, device, states)


def _verify_with_q(p, meta, generators, items, accept, final, num_usable) -> None:
    """Drafts drawn from q: accept d_j with probability min(1, p_j[d_j] / q_j[d_j]); at the first
    rejection n emit a draw from the residual norm(max(p_n - q_n, 0)) (p_n when that is all zero, or
    when d_n is outside the vocabulary or q_n[d_n] == 0); after the usable drafts, a draw from p_n."""
    width, vocab, device = meta.max_spec_len, p.shape[-1], p.device
    rows = device_tensor([row for row, _ in items], torch.long, device)  # [Q]
    index = device_tensor([i for _, i in items], torch.long, device)  # [Q]
    p = p[rows]  # [Q, K + 1, vocab]
    drafts = meta.padded_draft_ids[index]  # [Q, K]
    in_vocab = (drafts >= 0) & (drafts < vocab)  # [Q, K]
    ids = drafts.clamp(0, vocab - 1)  # [Q, K]
    p_draft = p[:, :width].gather(2, ids[..., None]).squeeze(-1)  # [Q, K]
    flat = (meta.cu_num_draft_tokens[index][:, None] + torch.arange(width, device=device)).clamp(
        max=meta.draft_probs.shape[0] - 1
    )  # [Q, K] (past k_i: a neighbour's row, never read)
    q = meta.draft_probs[flat]  # [Q, K, vocab]
    q_draft = q.gather(2, ids[..., None]).squeeze(-1)  # [Q, K]

    uniforms = torch.ones(len(items), width, device=device)  # [Q, K]; the request's own k_i draws
    for row, (_, i) in enumerate(items):
        k = meta.num_draft_tokens[i]
        uniforms[row, :k] = torch.rand(k, generator=generators[i], device=device)
    accepted = in_vocab & (q_draft > 0) & (uniforms * q_draft < p_draft)  # [Q, K]

    # the first rejection n among the usable drafts (n = the usable count: none was rejected)
    usable = num_usable[index]  # [Q]
    n = (accepted & (torch.arange(width, device=device) < usable[:, None])).long().cumprod(dim=1).sum(dim=1)
    at = n.clamp(max=width - 1)[:, None]  # [Q, 1] the rejected draft's column (if one was)
    arange = torch.arange(len(items), device=device)
    p_n = p[arange, n]  # [Q, vocab]
    plain = (n >= usable) | ~in_vocab.gather(1, at).squeeze(1) | ~(q_draft.gather(1, at).squeeze(1) > 0)
    residual = (p_n - q[arange, at.squeeze(1)]).clamp_min(0)  # [Q, vocab]
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p_n)  # all zero: p_n
    weights = torch.where(plain[:, None], p_n, residual)  # [Q, vocab]
    draws = [
        draw_token(weights[row], generators[i]) for row, (_, i) in enumerate(items)
    ]  # Q x [1]; weights need not be normalised
    accept[index] = accepted
    final[index] = torch.cat(draws)[:, None].expand(-1, width + 1)


def _rng_state(generator: torch.Generator | None, device: torch.device) -> Tensor:
    """The generator's state (a host copy: reading it waits for nothing on the device)."""
    if generator is not None:
        return generator.get_state()
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(generator: torch.Generator | None, device: torch.device, state: Tensor) -> None:
    if generator is not None:
        generator.set_state(state)
    elif device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)
