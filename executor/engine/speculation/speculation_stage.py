"""The executor's side of drafting: find the drafter, reserve draft slots, check what it proposes.

A drafter never gets to emit a token or to break a request. Every call into it goes through one
`DrafterGuard` (contained, held to a deadline, switched off when it keeps missing it); what it answers
is checked: slot counts must be integers >= 0, proposals are cut to the reserved slots and at the first
id outside the vocabulary, and a draft distribution q that is not a finite, non-negative
[drafts, vocab] tensor drops that request's drafts. Every draft token is verified by the target.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ....drafters.base import Drafter
from ....grammar.request_grammar import grammar_valid_nodes, grammar_valid_prefix
from ....sampling.tree_shape import depths, is_chain, pruned
from ..options import parse_options
from ..request import RequestState
from ..scheduler import ScheduledRequest
from .draft_length import DraftLengthPolicy
from .drafter_guard import DrafterGuard
from .proposal_check import checked_proposal
from .speculative_config import SpeculativeConfig
from .tree_drafts import shape_tree

_NOT_RUN = object()  # a guarded call's default: the drafter did not answer
INITIAL_SIBLING_HIT = 0.5  #: `SpeculationStage.sibling_hit` before any tree was verified
SIBLING_HIT_DECAY = 0.95  #: weight of the old estimate per observation


@dataclass(slots=True)
class SpeculationStats:
    """Aggregate drafting figures of one executor."""

    num_draft_steps: int = 0  #: request-steps that carried drafts
    drafting_time: float = 0.0  #: seconds spent in the drafter
    num_drafter_errors: int = 0  #: drafter calls that raised
    num_drafter_late: int = 0  #: drafter calls that missed their deadline
    num_garbage_answers: int = 0  #: answers that were not what the hook promises (dropped)
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


@dataclass(frozen=True, slots=True)
class DrafterChoice:
    """The drafter a ``speculative_config`` names: its factory and its options, parsed once (before any
    model loads) into the dataclass the factory declares, or left as the config's mapping."""

    name: str  #: ``decoding_type`` as configured
    factory: Callable
    options: object

    def build(self, context) -> Drafter:
        """The drafter, from ``factory(options, context)``; a ValueError when it returns something else."""
        drafter = self.factory(self.options, context)
        if not isinstance(drafter, Drafter):
            raise ValueError(
                f"drafter factory for {self.name!r} returned {type(drafter).__name__}, not a Drafter"
            )
        return drafter


def choose_drafter(spec: SpeculativeConfig, plugins) -> DrafterChoice:
    """Before any model loads: the drafter exists, takes ``(options, context)``, and its declared options
    (if it declares them) parse."""
    factory = find_drafter_factory(spec, plugins)
    first = next(iter(inspect.signature(factory).parameters), None)
    if first == "spec_config":
        raise ValueError(
            f"drafter factory for {spec.decoding_type!r} takes (spec_config, context): factories take "
            "(options, context) now; the config's max_draft_len is context.max_draft_len"
        )
    options_type = getattr(factory, "options", None)
    options = parse_options(options_type, spec.options) if options_type is not None else dict(spec.options)
    return DrafterChoice(spec.decoding_type, factory, options)


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


def _snapshot(request: RequestState):
    """The drafter's view of a guided request's grammar; None when unguided, or when the grammar is
    broken (the guided stage fails the request this same step)."""
    try:
        return request.grammar.snapshot() if request.grammar is not None else None
    except Exception:
        return None


def _is_slot_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class SpeculationStage:
    def __init__(
        self,
        plugins,
        drafter: Drafter | None,
        spec: SpeculativeConfig | None,
        vocab_size: int,
        policy: DraftLengthPolicy | None = None,
        deadline_s: float | None = None,
    ) -> None:
        self.plugins = plugins
        self.drafter = drafter
        self.spec = spec
        self.vocab_size = vocab_size
        self.policy = policy
        self.stats = SpeculationStats()
        isolated = not getattr(drafter, "runs_on_loop_thread", False)
        self.guard = DrafterGuard(type(drafter).__name__, deadline_s, isolated)
        self._unreleased: list[RequestState] = []  # finished while the drafter could not be called
        #: with draft_tree: how often a tree level's other nodes hold the target's token where the chain's
        #: node there is rejected (a running average over every tree; optimistic at first, so trees are
        #: tried); with the policy's chain rates it prices a tree against a chain each step
        self.sibling_hit = INITIAL_SIBLING_HIT
        self.trees_this_step = False  #: this step drafts trees (draft_tree on, and chosen over chains)
        #: this step's drafts the drafter gets, by request id (with trees: each tree's depth)
        self._drafter_slots: dict[str, int] = {}

    @property
    def tree(self):
        """The `TreeShape` the drafter drafts within (None: chains)."""
        return getattr(self.drafter, "draft_tree", None)

    @property
    def max_draft_len(self) -> int:
        return self.drafter.max_draft_len if self.drafter else 0

    @property
    def is_drafting(self) -> bool:
        return self.drafter is not None and self.guard.is_enabled

    def reserve_slots(self, running: list[RequestState], max_model_len: int) -> dict[RequestState, int]:
        """Before scheduling: ask the drafter for each decoding request's slots, capped; returns the
        slots wanted per request (none: no entry)."""
        self._drafter_slots = {}
        for request in running:
            request.drafting_grammar = None
        decoding = [r for r in running if r.num_uncomputed_tokens == 1]
        wanted_slots: dict[RequestState, int] = {}
        if not decoding or not self.is_drafting:
            return wanted_slots
        if self.drafter.use_grammar_masks:  # type: ignore[union-attr]
            for r in decoding:  # the drafter reads a snapshot, never the matcher the masks are built from
                r.drafting_grammar = _snapshot(r)
        answers = self._call(
            "specexec_prepare_draft_requests",
            lambda: self.plugins.hook.specexec_prepare_draft_requests(requests=decoding),
            [],
        )
        slots = self._merged(answers)
        batch_len = self.spec.draft_len_for_batch(len(running)) if self.spec else self.max_draft_len
        rooms = {  # the tokens each may still take after this step's one
            r: min(r.sampling_params.max_tokens - r.num_output_tokens, max_model_len - r.num_tokens) - 1
            for r in decoding
        }
        for r in decoding:
            wanted = slots.get(r.request_id, 0)
            if not _is_slot_count(wanted):
                self._garbage()  # no drafts for it this step
                wanted = 0
            num_slots = max(0, min(wanted, batch_len, rooms[r]))
            if num_slots:
                wanted_slots[r] = num_slots
        tree = self.tree
        self.trees_this_step = tree is not None
        if self.policy is not None and wanted_slots:
            by_id = {r.request_id: n for r, n in wanted_slots.items()}
            cost = self._draft_cost_per_token()
            if tree is None:
                chosen = self.policy.choose(by_id, len(running), cost)
            else:  # a tree's level costs `branching` rows: trees or chains, whichever pays more
                as_chain, chain_value = self.policy.plan(by_id, len(running), cost)
                as_tree, tree_value = self.policy.plan(
                    by_id, len(running), cost, tree.branching, self.sibling_hit
                )
                self.trees_this_step = tree_value > chain_value
                chosen = self.policy.with_probes(as_tree if self.trees_this_step else as_chain, by_id, cost)
            wanted_slots = {r: chosen[r.request_id] for r in wanted_slots if chosen[r.request_id]}
        self._drafter_slots = {r.request_id: n for r, n in wanted_slots.items()}  # (with trees: depths)
        if self.trees_this_step:  # the slots are the tree's nodes
            for r, depth in wanted_slots.items():
                wanted_slots[r] = max(depth, min(tree.nodes_for_depth(depth), rooms[r]))
        return wanted_slots

    def collect_drafts(
        self, batch: list[ScheduledRequest], resources, faults: dict[RequestState, str]
    ) -> None:
        """After scheduling: ask the drafter, then keep only what is safe to verify. A request whose
        own grammar fails while its drafts are checked is put in ``faults``."""
        # (slots the drafter did not ask for are the grammar's forced tokens, which take the place of
        # any proposal at least as short: the drafter is not asked for those)
        drafting = [
            s
            for s in batch
            if s.num_draft_slots
            and self._drafter_slots.get(s.request.request_id, 0) > 0
            and len(s.request.forced_token_ids or ()) < s.num_draft_slots
        ]
        if not drafting or not self.is_drafting:
            return
        start = time.perf_counter()
        for s in drafting:
            s.max_draft_depth = self._drafter_slots[s.request.request_id] if self.trees_this_step else 0
        answers = self._call(
            "specexec_prepare_draft_tokens",
            lambda: self.plugins.hook.specexec_prepare_draft_tokens(
                scheduled_requests=drafting, resources=resources
            ),
            [],
        )
        proposals = self._merged(answers)
        for s in drafting:
            r = s.request
            checked = checked_proposal(proposals.get(r.request_id), s.num_draft_slots, self.vocab_size)
            if checked.is_garbage:
                self._garbage()
            s.draft_token_ids, s.draft_probs, parents = checked.tokens, checked.probs, checked.parents
            if parents is not None:
                shape_tree(s, s.draft_token_ids, parents, self.trees_this_step)
            drafter = self.drafter
            if r.grammar is not None and drafter.use_grammar_masks and not drafter.accepts_grammar_masks:  # type: ignore[union-attr]
                try:
                    self._cut_to_grammar(s)
                except Exception as exc:
                    faults[r] = f"grammar failed while checking drafts: {exc}"
            self.stats.num_draft_steps += bool(s.draft_token_ids)
            self.stats.num_draft_tokens += len(s.draft_token_ids)
        self.stats.drafting_time += time.perf_counter() - start

    def observe(self, items: list[tuple[ScheduledRequest, int]]) -> None:
        """After verification, (scheduled request, accepted) of each: feed the policy (for a tree, how far
        its first branch was accepted: the chain the policy prices), the trees' sibling estimate and the
        drafter."""
        for s, num_accepted in items:
            rid = s.request.request_id
            if s.tree_depth:
                branch_len, on_branch = s.first_branch
                # where the chain's node was rejected within the tree: did another node hold the token?
                if on_branch < min(branch_len, s.tree_depth):
                    hit = float(num_accepted > on_branch)
                    self.sibling_hit = SIBLING_HIT_DECAY * self.sibling_hit + (1 - SIBLING_HIT_DECAY) * hit
                if self.policy is not None:
                    self.policy.observe(rid, branch_len, on_branch)
            elif self.policy is not None:
                self.policy.observe(rid, len(s.draft_token_ids), num_accepted)
        verified = [(s.request, a) for s, a in items if s.draft_token_ids]
        if verified and self.is_drafting:
            self.guard.call_each(
                "specexec_on_verified",
                lambda item: self.plugins.hook.specexec_on_verified(request=item[0], num_accepted=item[1]),
                verified,
            )
        self._sync_guard_stats()

    def release(self, requests: list[RequestState]) -> None:
        """Forget finished (or preempted) requests: policy, captured features, the drafter's state."""
        for request in requests:
            request.target_hidden.clear()
            request.drafting_grammar = None
            if self.policy is not None:
                self.policy.forget(request.request_id)
        if self.drafter is None:
            return
        pending = self._unreleased + requests
        ran = self.guard.call_each(
            "specexec_release_request",
            lambda request: self.plugins.hook.specexec_release_request(request=request),
            pending,
        )
        self._unreleased = [] if ran or not self.guard.is_enabled else pending
        self._sync_guard_stats()

    def hand_target_tokens(self, batch: list[ScheduledRequest], output) -> None:
        """For a drafter with ``wants_target_tokens``: each drafting request's drafts and the target's
        greedy token at each of their rows, on the request (before a tree is laid out as a chain)."""
        if not self.is_drafting or not getattr(self.drafter, "wants_target_tokens", False):
            return
        asking = [(i, s) for i, s in enumerate(batch) if s.completes_sequence and s.draft_token_ids]
        for s in batch:
            s.request.target_tokens = None
        if not asking:
            return
        rows = [r for i, _ in asking for r in range(output.cu_logit_rows[i], output.cu_logit_rows[i + 1])]
        greedy = output.logits[torch.tensor(rows, device=output.logits.device)].argmax(dim=-1).tolist()
        start = 0
        for i, s in asking:
            n = output.cu_logit_rows[i + 1] - output.cu_logit_rows[i]
            s.request.target_tokens = (list(s.draft_token_ids), greedy[start : start + n])
            start += n

    def keep_hidden_states(self, batch: list[ScheduledRequest], output, verifications) -> None:
        """Hand the drafter's layers of the verified positions to each request's ``target_hidden``."""
        layers = self.drafter.hidden_state_layers if self.is_drafting else ()  # type: ignore[union-attr]
        if layers:
            for i, (s, v) in enumerate(zip(batch, verifications)):
                if v is not None or not s.completes_sequence:
                    keep_verified_rows(s.request.target_hidden, s, v, output, i, layers)

    def close(self) -> None:
        self.guard.close()

    # ---- checks ---------------------------------------------------------------------------------------
    def _call(self, hook: str, fn, default):
        result = self.guard.call(hook, fn, default)
        self._sync_guard_stats()
        return result

    def _sync_guard_stats(self) -> None:
        self.stats.num_drafter_errors = self.guard.num_errors
        self.stats.num_drafter_late = self.guard.num_late

    def _garbage(self) -> None:
        self.stats.num_garbage_answers += 1

    def _merged(self, answers) -> dict:
        """One dict from the hook relay's answers (a list of dicts); garbage counts as an error."""
        merged: dict = {}
        for answer in answers if isinstance(answers, list) else [answers]:
            if isinstance(answer, dict):
                merged.update(answer)
            elif answer is not None:
                self._garbage()
        return merged

    def _draft_cost_per_token(self) -> float:
        """The drafter's time per proposed token, in the cost model's units (a one-token forward = cost(1))."""
        st = self.stats
        if not st.num_draft_tokens or not st.num_target_forwards or self.policy is None:
            return 0.0
        per_token = st.drafting_time / st.num_draft_tokens
        per_forward = st.target_time / st.num_target_forwards
        return per_token / per_forward * self.policy.cost_model.cost(1)

    def _cut_to_grammar(self, s: ScheduledRequest) -> None:
        """Drop the drafts the request's grammar rejects (they could never be accepted): a chain's from
        the first one it rejects, a tree's nodes whose path from the root it rejects."""
        grammar, num_drafts = s.request.grammar, len(s.draft_token_ids)
        if s.draft_parents is None:
            keep = grammar_valid_prefix(grammar, s.draft_token_ids)
            s.draft_token_ids = s.draft_token_ids[:keep]
            if s.draft_probs is not None:
                s.draft_probs = s.draft_probs[:keep]
        else:
            valid = grammar_valid_nodes(grammar, s.draft_token_ids, s.draft_parents)
            kept, parents = pruned(s.draft_parents, valid)
            s.draft_token_ids = [s.draft_token_ids[i] for i in kept]
            s.draft_parents = None if is_chain(parents) else parents
            s.tree_depth = max(depths(parents), default=0) if s.draft_parents is not None else 0
        s.request.metrics.num_grammar_rejected_drafts += num_drafts - len(s.draft_token_ids)
