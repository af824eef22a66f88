"""The executor's side of guided decoding: compile each request's grammar off the loop (schemas are
normalized first, and keywords the grammar cannot enforce refused or warned about), keep the request
waiting until it is ready, build the ``1 + k`` mask rows of every guided request on the mask worker
while the target forward runs, apply them, roll the matchers back after verification, and check
each finished output against what was asked for.

Every method that touches one request's grammar reports a failure as (request, message) or raises for
that request alone; nothing here fails the whole step.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from .inputs import InvalidRequestError
from .request import RequestState
from .scheduler import ScheduledRequest

logger = logging.getLogger("specexec")

#: longest grammar-forced run proposed as drafts in one step
MAX_FORCED_TOKENS = 16


@dataclass(slots=True)
class GuidedStats:
    """Aggregate figures of guided decoding in one executor."""

    num_steps: int = 0  #: steps that built masks
    mask_build_ms: float = 0.0  #: worker time building masks
    mask_wait_ms: float = 0.0  #: time the loop waited for them after the forward (0 = fully overlapped)


class GuidedDecodingStage:
    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        max_rows: int,
        device,
        max_json_whitespace: int | None = None,
        unsupported: str = "refuse",
        compile_timeout_s: float = 30.0,
    ) -> None:
        self.max_json_whitespace = max_json_whitespace  #: JSON whitespace run limit (0 = compact)
        self.unsupported = unsupported  #: "refuse" or "warn" for keywords the grammar cannot enforce
        self.compile_timeout_s = compile_timeout_s
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        #: no EOS: a grammar ends its request when its output is complete (no stop token can)
        self.ends_without_stop_token = not self.eos_token_ids
        self.max_rows = max_rows
        self.device = device
        self.stats = GuidedStats()
        self._pool = None
        self._worker = None
        # (scheduled request, row0) of the masks in flight
        self._jobs: list[tuple[ScheduledRequest, int]] = []

    # ---- compiling --------------------------------------------------------------------------------
    @property
    def pool(self):
        if self._pool is None:
            from ...grammar import GrammarCompilerPool

            if self.tokenizer is None:
                raise InvalidRequestError("guided decoding needs the model's tokenizer")
            self._pool = GrammarCompilerPool(
                self.tokenizer,
                self.vocab_size,
                self.eos_token_ids,
                max_json_whitespace=self.max_json_whitespace,
            )
        return self._pool

    def submit(self, state: RequestState, response_format) -> None:
        """Start compiling a request's grammar. A malformed response_format, or (with ``refuse``) a
        schema keyword the grammar cannot enforce, raises InvalidRequestError naming it."""
        from ...grammar import GrammarSpec

        spec = GrammarSpec.from_response_format(response_format)
        if spec is None:
            return
        state.grammar_spec = spec
        if spec.kind == "json_schema":
            spec = self._enforceable(state, spec)
        state.grammar_future = self.pool.submit(spec)
        state.grammar_deadline = time.perf_counter() + self.compile_timeout_s

    def _enforceable(self, state: RequestState, spec):
        """The normalized schema to compile; its unenforceable keywords refused or noted on the request."""
        import json

        from ...grammar import GrammarSpec
        from ...grammar.schema.normalize import normalize_schema
        from ...grammar.schema.support import find_unsupported

        normalized = normalize_schema(json.loads(spec.text))
        unsupported = find_unsupported(normalized)
        if unsupported:
            names = "; ".join(f"{u.keyword} at {u.path or '/'} ({u.reason})" for u in unsupported)
            if self.unsupported == "refuse":
                raise InvalidRequestError(
                    f"the schema uses what guided decoding cannot enforce: {names} "
                    "(guided_unsupported: warn generates anyway and says so on the output)"
                )
            state.guided_warnings.append(f"not enforced while generating: {names}")
        return GrammarSpec.from_response_format(
            {"type": "json_schema", "json_schema": {"schema": normalized}}
        )

    def resolve(self, waiting) -> list[tuple[RequestState, str]]:
        """Give each waiting request whose grammar compiled its matcher; returns the requests that
        failed: their grammar did not compile, or not within ``compile_timeout_s``."""
        from ...grammar import RequestGrammar

        failed = []
        now = time.perf_counter()
        for r in waiting:
            fut = r.grammar_future
            if fut is None or r.grammar is not None:
                continue
            if not fut.done():
                if now > r.grammar_deadline:
                    self.pool.abandon(fut)
                    failed.append((r, f"grammar did not compile within {self.compile_timeout_s} s"))
                continue
            try:
                compiled = fut.result()
            except Exception as exc:  # GrammarError: the request's grammar does not compile
                r.is_invalid_request = True
                failed.append((r, str(exc)))
                continue
            try:
                r.grammar = RequestGrammar(
                    compiled,
                    override_stop_tokens=self.eos_token_ids or None,
                    terminate_without_stop_token=self.ends_without_stop_token,
                )
                if r.num_output_tokens:  # recomputed after preemption: replay what it already emitted
                    r.grammar.accept_now(r.output_token_ids)
            except Exception as exc:  # a matcher that cannot start
                failed.append((r, str(exc)))
        return failed

    # ---- grammar-forced tokens as drafts ---------------------------------------------------------
    def reserve_forced(
        self, running: list[RequestState], max_model_len: int, draft_slots: dict[RequestState, int]
    ) -> list[tuple[RequestState, str]]:
        """Where the grammar forces the next tokens (a bounded walk: the only allowed token, or the
        longest when every other allowed one is a prefix of it), they become this step's drafts: their
        slots are added to ``draft_slots``. Returns the requests whose grammar failed."""
        failed = []
        vocab_bytes = self._pool.vocab_bytes if self._pool is not None else None
        for r in running:
            r.forced_token_ids = []
            if r.grammar is None or r.num_uncomputed_tokens != 1:
                continue
            room = min(r.sampling_params.max_tokens - r.num_output_tokens, max_model_len - r.num_tokens) - 1
            try:
                forced = (
                    r.grammar.forced_tokens(min(MAX_FORCED_TOKENS, room), vocab_bytes) if room > 0 else []
                )
            except Exception as exc:
                failed.append((r, f"grammar failed: {exc}"))
                continue
            if forced:
                r.forced_token_ids = forced
                draft_slots[r] = max(draft_slots.get(r, 0), len(forced))
        return failed

    def use_forced(self, batch: list[ScheduledRequest]) -> None:
        """Forced tokens take the place of the drafter's proposal (they are at least as likely)."""
        for s in batch:
            r = s.request
            if r.forced_token_ids and s.num_draft_slots and len(r.forced_token_ids) >= len(s.draft_token_ids):
                s.draft_token_ids = r.forced_token_ids[: s.num_draft_slots]
                s.draft_probs = None
                s.draft_parents, s.tree_depth = None, 0  # (a tree the drafter proposed gives way too)
                r.metrics.num_forced_tokens += len(s.draft_token_ids)

    # ---- masks ------------------------------------------------------------------------------------
    @property
    def worker(self):
        if self._worker is None:
            from ...grammar import MaskWorker

            self._worker = MaskWorker(self.max_rows, self.vocab_size, self.device)
        return self._worker

    def start_masks(self, batch: list[ScheduledRequest]) -> None:
        """Before the forward: queue the mask rows of every guided request that yields tokens."""
        from ...grammar import MaskJob

        jobs, self._jobs, row = [], [], 0
        for s in batch:
            if not s.completes_sequence:
                continue
            r = s.request
            if r.grammar is not None:
                parents = tuple(s.draft_parents) if s.draft_parents is not None else None
                jobs.append(MaskJob(r.grammar, row, tuple(s.draft_token_ids), parents))
                self._jobs.append((s, row))
            row += 1 + len(s.draft_token_ids)
        if jobs:
            self.worker.start(jobs, row)

    def wait_masks(self, faults: dict[RequestState, str]):
        """After the forward: wait for the masks (the mask-ready event); a request whose rows could not
        be built goes into ``faults``. None when no request of the step is guided."""
        if not self._jobs:
            return None
        result = self.worker.wait()
        self.stats.num_steps += 1
        self.stats.mask_build_ms += result.build_ms
        self.stats.mask_wait_ms += result.wait_ms
        share = result.wait_ms / len(self._jobs)
        for (s, _), fill, error in zip(self._jobs, result.fills, result.errors):
            r = s.request
            if error is not None:
                faults[r] = error
                continue
            m = r.metrics
            m.mask_wait_ms += share
            m.mask_build_ms += result.build_ms / len(self._jobs)
            m.num_mask_rows_skipped += 1 + len(s.draft_token_ids) - fill.num_rows_filled
            r.grammar_fill = fill
        self._jobs = []
        return result

    def apply_masks(self, logits: torch.Tensor, masks) -> None:
        """Mask the logits of guided requests in place (kernels/: torch on CPU, CuPy on CUDA)."""
        if masks is not None:
            from ...kernels import apply_mask_inplace

            apply_mask_inplace(logits, masks.bitmask, masks.needs_mask)

    def drain(self) -> None:
        """An interrupted step: wait for the worker so it lets go of the grammars it holds."""
        if self._jobs:
            self._jobs = []
            try:
                self.worker.wait()
            except Exception:  # (the step is being given up anyway)
                logger.debug("mask worker failed while draining", exc_info=True)

    # ---- after verification -----------------------------------------------------------------------
    def after_verification(
        self, s: ScheduledRequest, num_accepted: int, emitted: list[int]
    ) -> tuple[list[int], bool]:
        """Roll back the drafts the target rejected (the last emitted token is accepted next step).
        Returns the emitted tokens that belong to the output (none past the grammar's end) and whether
        the grammar is complete, which ends the request."""
        r = s.request
        fill, r.grammar_fill = r.grammar_fill, None
        if r.grammar is None:
            return emitted, False
        num_drafts = len(s.draft_token_ids)
        if fill is not None and fill.tree_rows is not None:
            return self._after_tree(s, fill, num_accepted, emitted)
        if fill is not None and fill.terminated and num_accepted >= fill.num_drafts_accepted_by_grammar:
            keep = fill.num_drafts_accepted_by_grammar  # the grammar ended inside this step's drafts
            r.grammar.after_verification(keep, None)
            return emitted[:keep], True
        if (
            fill is not None
            and fill.first_invalid_draft_index is not None
            and (num_accepted == fill.first_invalid_draft_index)
        ):
            r.metrics.num_grammar_rejected_drafts += num_drafts - num_accepted
        else:
            r.metrics.num_target_rejected_drafts += num_drafts - num_accepted
        last = emitted[num_accepted] if len(emitted) > num_accepted else None
        r.grammar.after_verification(num_accepted, last)
        ends = self.ends_without_stop_token or last in r.grammar.stop_token_ids
        return emitted, ends and r.grammar.is_terminated()

    def _after_tree(
        self, s: ScheduledRequest, fill, num_accepted: int, emitted: list[int]
    ) -> tuple[list[int], bool]:
        """`after_verification` of a token tree: its drafts are laid out with the accepted branch first
        (`speculation/tree_drafts.py`), whose tokens the matcher now accepts."""
        r = s.request
        refused = min(fill.num_invalid_nodes, len(s.draft_token_ids) - num_accepted)
        r.metrics.num_grammar_rejected_drafts += refused
        r.metrics.num_target_rejected_drafts += len(s.draft_token_ids) - num_accepted - refused
        last = emitted[num_accepted] if len(emitted) > num_accepted else None
        ended_after = r.grammar.after_tree_verification(s.draft_token_ids[:num_accepted], last)
        if ended_after is not None:  # the grammar ended inside the branch
            return emitted[:ended_after], True
        ends = self.ends_without_stop_token or last in r.grammar.stop_token_ids
        return emitted, ends and r.grammar.is_terminated()

    def check_output(self, r: RequestState, text: str) -> None:
        """A finished guided request: check its output against its schema / regex (`guided_valid`)."""
        spec = r.grammar_spec
        if spec is None:
            return
        from ...grammar.output_check import check_guided_output

        verdict = check_guided_output(spec.kind, spec.text, text)
        r.guided_valid, r.guided_error = verdict.valid, verdict.error

    def release(self, r: RequestState) -> None:
        """Drop a finished request's grammar state (or, to recompute it, its matcher only: the matcher
        is made again and replays the request's output when it is scheduled)."""
        r.grammar = None
        r.grammar_fill = None
        r.drafting_grammar = None
        r.forced_token_ids = []

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._pool is not None:
            self._pool.shutdown()
