"""The executor's side of guided decoding: compile each request's grammar off the loop, keep the
request waiting until it is ready, build the ``1 + k`` mask rows of every guided request on the mask
worker while the target forward runs, apply them, and roll the matchers back after verification.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

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
    ) -> None:
        self.max_json_whitespace = max_json_whitespace  #: JSON whitespace run limit (0 = compact)
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.max_rows = max_rows
        self.device = device
        self.stats = GuidedStats()
        self._pool = None
        self._worker = None
        self._jobs: list[tuple[RequestState, int]] = []  # (request, row0) of the masks in flight

    # ---- compiling --------------------------------------------------------------------------------
    @property
    def pool(self):
        if self._pool is None:
            from ..grammar import GrammarCompilerPool

            if self.tokenizer is None:
                raise ValueError("guided decoding needs the model's tokenizer")
            self._pool = GrammarCompilerPool(
                self.tokenizer,
                self.vocab_size,
                self.eos_token_ids,
                max_json_whitespace=self.max_json_whitespace,
            )
        return self._pool

    def submit(self, state: RequestState, response_format) -> None:
        """Start compiling a request's grammar; a malformed response_format raises ValueError."""
        from ..grammar import GrammarSpec

        spec = GrammarSpec.from_response_format(response_format)
        if spec is not None:
            state.grammar_future = self.pool.submit(spec)

    def resolve(self, waiting: list[RequestState]) -> list[tuple[RequestState, str]]:
        """Give each waiting request whose grammar compiled its matcher; returns those that failed."""
        from ..grammar import RequestGrammar

        failed = []
        for r in waiting:
            fut = r.grammar_future
            if fut is None or r.grammar is not None or not fut.done():
                continue
            exc = fut.exception()
            if exc is not None:
                failed.append((r, str(exc)))
                continue
            r.grammar = RequestGrammar(fut.result(), override_stop_tokens=self.eos_token_ids or None)
            if r.num_output_tokens:  # recomputed after preemption: replay what it already emitted
                r.grammar.accept_now(r.output_token_ids)
        return failed

    # ---- grammar-forced tokens as drafts ---------------------------------------------------------
    def reserve_forced(self, running: list[RequestState], max_model_len: int) -> None:
        """Where the grammar allows exactly one continuation (xgrammar's jump-forward string), its
        tokens become this step's drafts: the masked target can only accept them."""
        from ..drafters.base import grammar_valid_prefix

        for r in running:
            r.forced_token_ids = []
            if r.grammar is None or r.num_uncomputed_tokens != 1 or self.tokenizer is None:
                continue
            text = r.grammar.jump_forward_string()
            if not text:
                continue
            tokens = self.tokenizer.encode(text, add_special_tokens=False)[:MAX_FORCED_TOKENS]
            room = min(r.sampling_params.max_tokens - r.num_output_tokens, max_model_len - r.num_tokens) - 1
            forced = tokens[: max(0, min(grammar_valid_prefix(r.grammar, tokens), room))]
            if forced:
                r.forced_token_ids = forced
                r.num_draft_slots = max(r.num_draft_slots, len(forced))

    def use_forced(self, batch: list[ScheduledRequest]) -> None:
        """Forced tokens take the place of the drafter's proposal (they are at least as likely)."""
        for s in batch:
            r = s.request
            if r.forced_token_ids and s.num_draft_slots and len(r.forced_token_ids) >= len(r.draft_token_ids):
                r.draft_token_ids = r.forced_token_ids[: s.num_draft_slots]
                r.draft_probs = None
                r.metrics.num_forced_tokens += len(r.draft_token_ids)

    # ---- masks ------------------------------------------------------------------------------------
    @property
    def worker(self):
        if self._worker is None:
            from ..grammar import MaskWorker

            self._worker = MaskWorker(self.max_rows, self.vocab_size, self.device)
        return self._worker

    def start_masks(self, batch: list[ScheduledRequest]) -> None:
        """Before the forward: queue the mask rows of every guided request that yields tokens."""
        from ..grammar import MaskJob

        jobs, self._jobs, row = [], [], 0
        for s in batch:
            if not s.completes_sequence:
                continue
            r = s.request
            if r.grammar is not None:
                jobs.append(MaskJob(r.grammar, row, tuple(r.draft_token_ids)))
                self._jobs.append((r, row))
            row += 1 + len(r.draft_token_ids)
        if jobs:
            self.worker.start(jobs, row)

    def apply_masks(self, logits: torch.Tensor) -> None:
        """After the forward: wait for the masks (the mask-ready event) and apply them in place."""
        if not self._jobs:
            return
        from ..kernels import apply_mask_inplace

        result = self.worker.wait()
        apply_mask_inplace(logits, result.bitmask, result.needs_mask)
        self.stats.num_steps += 1
        self.stats.mask_build_ms += result.build_ms
        self.stats.mask_wait_ms += result.wait_ms
        share = result.wait_ms / len(self._jobs)
        for (r, _), fill in zip(self._jobs, result.fills):
            m = r.metrics
            m.mask_wait_ms += share
            m.mask_build_ms += result.build_ms / len(self._jobs)
            m.num_mask_rows_skipped += 1 + len(r.draft_token_ids) - fill.num_rows_filled
            r.grammar_fill = fill

    def after_verification(self, r: RequestState, num_accepted: int, emitted: list[int]) -> None:
        """Roll back the drafts the target rejected; the last emitted token is accepted next step."""
        fill = r.grammar_fill
        if r.grammar is None or fill is None:
            return
        r.grammar_fill = None
        num_drafts = len(r.draft_token_ids)
        if fill.first_invalid_draft_index is not None and num_accepted == fill.first_invalid_draft_index:
            r.metrics.num_grammar_rejected_drafts += num_drafts - num_accepted
        else:
            r.metrics.num_target_rejected_drafts += num_drafts - num_accepted
        r.grammar.after_verification(
            num_accepted, emitted[num_accepted] if len(emitted) > num_accepted else None
        )

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
