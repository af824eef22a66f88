"""The executor's side of drafting: find the drafter, reserve draft slots, check what it proposes.

A drafter never gets to emit a token: proposals are cut to the reserved slots and at the first id
outside the vocabulary, a drafter that raises leaves its requests without drafts for that step (logged
once), and every draft token is verified by the target.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from ..drafters.base import Drafter, DrafterContext, DraftProposal, grammar_valid_prefix
from .draft_length import DraftLengthPolicy
from .request import RequestState
from .scheduler import ScheduledRequest
from .speculative_config import SpeculativeConfig

logger = logging.getLogger("specexec")


@dataclass(slots=True)
class SpeculationStats:
    """Aggregate drafting figures of one executor."""

    num_draft_steps: int = 0  #: request-steps that carried drafts
    drafting_time: float = 0.0  #: seconds spent in the drafter
    num_drafter_errors: int = 0  #: steps where the drafter raised
    num_draft_tokens: int = 0  #: draft tokens proposed (after checks)
    target_time: float = 0.0  #: seconds spent in target forwards
    num_target_forwards: int = 0


def known_drafters(plugins) -> dict[str, object]:
    factories: dict[str, object] = {}
    for result in plugins.hook.specexec_drafter_factories():
        factories.update(result or {})
    return factories


def find_drafter_factory(spec: SpeculativeConfig, plugins):
    """The factory named by ``spec.decoding_type`` (case-insensitive); a clear error when unknown."""
    factories = known_drafters(plugins)
    factory = {name.lower(): f for name, f in factories.items()}.get(spec.decoding_type.lower())
    if factory is None:
        plugin_names = sorted(n for n, _ in plugins.list_name_plugin() if n and not n.startswith("specexec."))
        raise ValueError(
            f"unknown speculative_config.decoding_type {spec.decoding_type!r}; "
            f"known: {', '.join(sorted(factories))}; installed plugins: {', '.join(plugin_names) or 'none'}"
        )
    return factory


def build_drafter(spec: SpeculativeConfig, context: DrafterContext, plugins) -> Drafter:
    """The drafter named by ``spec.decoding_type``, from the built-ins or a plugin."""
    drafter = find_drafter_factory(spec, plugins)(spec_config=spec, context=context)
    if not isinstance(drafter, Drafter):
        raise ValueError(
            f"drafter factory for {spec.decoding_type!r} returned {type(drafter).__name__}, not a Drafter"
        )
    return drafter


def keep_verified_rows(
    chunks: list[tuple[int, torch.Tensor]],
    scheduled: ScheduledRequest,
    verification,
    output,
    index: int,
    layers: tuple[int, ...],
) -> None:
    """Append (position, rows [n, len(layers) * hidden]) of the verified positions of one request in
    this forward: its new tokens (a prompt chunk, or the token fed) and its accepted drafts; rows of
    rejected drafts are dropped. Called before the request's progress is updated; a request computed
    from position 0 again (first chunk, or recomputed after preemption) starts over."""
    r = scheduled.request
    start = output.cu_tokens[index]
    num_rows = scheduled.num_new_tokens + (verification.num_accepted if verification else 0)
    rows = torch.cat([output.hidden_states[layer][start : start + num_rows] for layer in layers], -1)
    if r.num_computed_tokens == 0:
        chunks.clear()
    chunks.append((r.num_computed_tokens, rows))


class SpeculationStage:
    def __init__(
        self,
        plugins,
        drafter: Drafter | None,
        spec: SpeculativeConfig | None,
        vocab_size: int,
        policy: DraftLengthPolicy | None = None,
    ) -> None:
        self.plugins = plugins
        self.drafter = drafter
        self.spec = spec
        self.vocab_size = vocab_size
        self.policy = policy
        self.stats = SpeculationStats()
        self._logged_error = False

    @property
    def max_draft_len(self) -> int:
        return self.drafter.max_draft_len if self.drafter else 0

    def reserve_slots(self, running: list[RequestState], max_model_len: int) -> None:
        """Before scheduling: reset drafts, let the drafter size each decoding request's slots, cap them."""
        for request in running:
            request.num_draft_slots = 0
            request.draft_token_ids = []
            request.draft_probs = None
        decoding = [r for r in running if r.num_uncomputed_tokens == 1]
        if not decoding or self.drafter is None:
            return
        try:
            self.plugins.hook.specexec_prepare_draft_requests(requests=decoding)
        except Exception:  # no drafts this step
            self._drafter_failed("specexec_prepare_draft_requests")
            for r in decoding:
                r.num_draft_slots = 0
            return
        batch_len = self.spec.draft_len_for_batch(len(running)) if self.spec else self.max_draft_len
        for r in decoding:
            room = min(r.sampling_params.max_tokens - r.num_output_tokens, max_model_len - r.num_tokens) - 1
            r.num_draft_slots = max(0, min(r.num_draft_slots, batch_len, room))
            if self.policy is not None and r.num_draft_slots:
                chosen = self.policy.choose(r.request_id, len(running), self._draft_cost_per_token())
                r.num_draft_slots = min(r.num_draft_slots, chosen)

    def _draft_cost_per_token(self) -> float:
        """The drafter's time per proposed token, in the cost model's units (a one-token forward = cost(1))."""
        st = self.stats
        if not st.num_draft_tokens or not st.num_target_forwards or self.policy is None:
            return 0.0
        per_token = st.drafting_time / st.num_draft_tokens
        per_forward = st.target_time / st.num_target_forwards
        return per_token / per_forward * self.policy.cost_model.cost(1)

    def observe(self, request: RequestState, num_drafts: int, num_accepted: int) -> None:
        """After verification: feed the acceptance to the policy and the drafter."""
        if self.policy is not None:
            self.policy.observe(request.request_id, num_drafts, num_accepted)
        if num_drafts:
            try:
                self.plugins.hook.specexec_on_verified(request=request, num_accepted=num_accepted)
            except Exception:
                self._drafter_failed("specexec_on_verified")

    def _drafter_failed(self, hook: str) -> None:
        self.stats.num_drafter_errors += 1
        if not self._logged_error:
            logger.exception(
                "drafter %s raised in %s; its requests continue without drafts",
                type(self.drafter).__name__,
                hook,
            )
            self._logged_error = True

    def release(self, request: RequestState) -> None:
        request.target_hidden.clear()
        if self.policy is not None:
            self.policy.forget(request.request_id)
        self.plugins.hook.specexec_release_request(request=request)

    def collect_drafts(self, batch: list[ScheduledRequest], resources) -> None:
        """After scheduling: ask the drafter, then keep only what is safe to verify."""
        drafting = [s for s in batch if s.num_draft_slots]
        if not drafting or self.drafter is None:  # (slots without a drafter: grammar-forced tokens)
            return
        start = time.perf_counter()
        try:
            proposals: dict[str, DraftProposal] = {}
            for result in self.plugins.hook.specexec_prepare_draft_tokens(
                scheduled_requests=drafting, resources=resources
            ):
                proposals.update(result or {})
        except Exception:  # a faulty drafter costs its requests their drafts, never their output
            self._drafter_failed("specexec_prepare_draft_tokens")
            proposals = {}
        for s in drafting:
            proposal = proposals.get(s.request.request_id)
            s.request.draft_token_ids, s.request.draft_probs = self._checked(proposal, s.num_draft_slots)
            drafter = self.drafter
            if (
                s.request.grammar is not None
                and drafter.use_grammar_masks
                and not drafter.accepts_grammar_masks
            ):
                self._cut_to_grammar(s.request)
            self.stats.num_draft_steps += bool(s.request.draft_token_ids)
            self.stats.num_draft_tokens += len(s.request.draft_token_ids)
        self.stats.drafting_time += time.perf_counter() - start

    def keep_hidden_states(self, batch: list[ScheduledRequest], output, verifications) -> None:
        """Hand the drafter's layers of the verified positions to each request's ``target_hidden``."""
        layers = self.drafter.hidden_state_layers if self.drafter else ()
        if layers:
            for i, (s, v) in enumerate(zip(batch, verifications)):
                keep_verified_rows(s.request.target_hidden, s, v, output, i, layers)

    def _cut_to_grammar(self, request: RequestState) -> None:
        """Drop drafts from the first one the request's grammar rejects (it could never be accepted)."""
        keep = grammar_valid_prefix(request.grammar, request.draft_token_ids)
        request.metrics.num_grammar_rejected_drafts += len(request.draft_token_ids) - keep
        request.draft_token_ids = request.draft_token_ids[:keep]
        if request.draft_probs is not None:
            request.draft_probs = request.draft_probs[:keep]

    def _checked(
        self, proposal: DraftProposal | None, num_slots: int
    ) -> tuple[list[int], torch.Tensor | None]:
        if proposal is None or not isinstance(proposal, DraftProposal):
            return [], None
        try:
            candidates = list(proposal.token_ids)[:num_slots]
        except TypeError:  # token_ids is not a sequence
            return [], None
        tokens = []
        for t in candidates:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                break  # cut at the first id that is not a token of this vocabulary
            tokens.append(t)
        probs = proposal.probs
        if probs is not None:
            if (
                not isinstance(probs, torch.Tensor)
                or probs.dim() != 2
                or probs.shape[0] < len(tokens)
                or probs.shape[1] < self.vocab_size
            ):
                return [], None  # q that does not match the drafts cannot be verified losslessly
            probs = probs[: len(tokens), : self.vocab_size]
        return tokens, probs
