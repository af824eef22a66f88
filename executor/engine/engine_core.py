"""The engine core: the step loop and its stages, nothing else. Set-up (loading, KV sizing, the cost
curve) is in `engine_setup.py`; the front callers use (submit, run, stream, abort, close) in `executor.py`.

One step():
  _prepare_draft_requests  draft slots (drafter, grammar-forced tokens)  _schedule         batch + KV pages
  _prepare_draft_tokens    drafts (drafter, forced tokens), flattened     _forward          one target forward
  _wait_for_masks          the mask-ready event                           _apply_masks      masks on logits
  _sample                  verify drafts, emit tokens                     _update_requests  append, stop checks
  _free_resources          rewind rejected slots, finish and free

Faults: a stage that fails for one request records it in the step's ``faults``; later stages skip it
and `_free_resources` finishes it with finish_reason "error", a message naming the cause, and frees all
it held (KV pages, grammar, drafter state). A failed batched forward is retried one request at a time,
so a request that breaks the model fails alone. An exception no stage could pin on a request fails the
step's batch; an interrupt (KeyboardInterrupt) puts the batch back to be recomputed. Either way the
core stays usable.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import time
from dataclasses import dataclass

from ...sampling.logprobs import TokenLogprob
from ...sampling.rejection import RejectionSampler, Verification
from ...sampling.spec_decode_metadata import SpecDecodeMetadata
from ..layers.row_summary import row_summary
from ..model.forward_io import ForwardOutput, KVCacheLost, SequenceInput, merge_outputs
from ..model.model_runner import ModelRunner
from .guided import GuidedDecodingStage
from .logit_stages import apply_penalties_and_bias, emitted_logprobs
from .output_processor import OutputProcessor
from .prompt_scoring import prompt_rows_of, take_prompt_logprobs
from .request import FinishReason, RequestState, TokenEvent
from .scheduler import ScheduledRequest, Scheduler
from .speculation.speculation_stage import SpeculationStage, keep_verified_rows
from .speculation.tree_drafts import move_accepted_kv
from .verify_stage import Faults, VerifyStage, flatten_drafts

logger = logging.getLogger("specexec")


@dataclass(slots=True)
class StepResources:
    """What drafters may use during a step."""

    target: ModelRunner  #: the target model's runner (its KV cache, captured hidden states)
    tokenizer: object | None
    vocab_size: int  #: the target's vocabulary size


class EngineCore:
    def __init__(
        self,
        runner: ModelRunner,
        scheduler: Scheduler,
        speculation: SpeculationStage,
        guided: GuidedDecodingStage,
        outputs: OutputProcessor,
        max_model_len: int,
        vocab_size: int,
        capture_layers: tuple[int, ...] = (),
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.block_manager = scheduler.block_manager
        self.speculation = speculation
        self.guided = guided
        self.outputs = outputs
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.capture_layers = capture_layers  #: hidden states returned on the outputs
        self.verifier = VerifyStage(RejectionSampler(row_summary), vocab_size)
        self.resources = StepResources(runner, outputs.tokenizer, vocab_size)
        self._submitted: collections.deque[RequestState] = collections.deque()  # from any thread
        self._events: list[TokenEvent] = []  # this step's events
        self._released: list[RequestState] = []  # finished this step: the drafter forgets them at its end

    # ---- requests in and out (the front holds the loop while calling these, except add_request) ------
    def add_request(self, state: RequestState) -> None:
        """Queue a validated request; it joins the waiting queue at the next step (thread-safe)."""
        self._submitted.append(state)

    def has_unfinished(self) -> bool:
        return bool(self._submitted) or self.scheduler.has_unfinished()

    def queue_sizes(self) -> tuple[int, int]:
        """(waiting, running) requests, the submitted ones counted as waiting; a snapshot that any
        thread may take (metrics, a server's queue limit)."""
        return len(self._submitted) + len(self.scheduler.waiting), len(self.scheduler.running)

    def abort(self, request_id: str) -> TokenEvent | None:
        """Finish a waiting or running request with finish_reason "abort" and free all it holds."""
        self._admit_submitted()
        for r in (*self.scheduler.waiting, *self.scheduler.running):
            if r.request_id == request_id:
                r.finish_reason = FinishReason.ABORT
                self._finish(r)
                self._release_finished()
                return self._events.pop()
        return None

    def close(self) -> None:
        self.speculation.close()
        self.guided.close()
        close_runner = getattr(self.runner, "close", None)  # (tensor parallelism: stops its workers)
        if close_runner is not None:
            close_runner()

    def step(self) -> list[TokenEvent]:
        """One iteration of the loop; returns the token events it produced."""
        self._admit_submitted()
        draft_slots = self._prepare_draft_requests()
        batch = self._schedule(draft_slots)
        if not batch:
            self._wait_for_grammars()
        else:
            try:
                self._run_batch(batch)
            except KVCacheLost as exc:  # every page's K/V is gone (tensor-parallel ranks restarted)
                self._fail_holders_of_pages(exc)
            except Exception as exc:  # no stage could pin it on a request: the batch's requests fail
                self._fail_batch(batch, exc)
            except BaseException:  # an interrupt: give the step up, nothing of it is lost
                self._requeue_batch(batch)
                raise
        self._release_finished()
        events, self._events = self._events, []
        return events

    def _run_batch(self, batch: list[ScheduledRequest]) -> None:
        faults: Faults = {}
        drafts = self._prepare_draft_tokens(batch, faults)  # the step's flattened drafts, built once
        self.guided.start_masks(batch)  # the mask worker builds the grammar masks during the forward
        output = self._forward(batch, faults)
        masks = self._wait_for_masks(faults)
        verifications: list[Verification | None] = [None] * len(batch)
        logprobs: list[list[TokenLogprob] | None] = [None] * len(batch)
        if output is not None:
            self._apply_penalties(batch, output)
            self._apply_masks(output, masks)
            verifications = self._sample(batch, output, drafts, masks, faults)
            logprobs = self._compute_logprobs(batch, output, verifications, faults)
            self._keep_hidden_states(batch, output, verifications, faults)
        kept = self._update_requests(batch, verifications, logprobs, faults)
        self._free_resources(batch, verifications, faults, kept)

    # ---- the stages -------------------------------------------------------------------------------
    def _admit_submitted(self) -> None:
        while self._submitted:
            self.scheduler.add(self._submitted.popleft())

    def _prepare_draft_requests(self) -> dict[RequestState, int]:
        """Draft slots wanted per decoding request: the drafter's, widened for grammar-forced tokens."""
        draft_slots = self.speculation.reserve_slots(self.scheduler.running, self.max_model_len)
        running = self.scheduler.running
        for r, message in self.guided.reserve_forced(running, self.max_model_len, draft_slots):
            self._finish_with_error(r, message)
        return draft_slots

    def _schedule(self, draft_slots: dict[RequestState, int]) -> list[ScheduledRequest]:
        for r, message in self.guided.resolve(list(self.scheduler.waiting)):
            self._finish_with_error(r, message)
        return self.scheduler.schedule(draft_slots)

    def _wait_for_grammars(self) -> None:
        """Nothing could run: block briefly on the grammars still compiling instead of spinning."""
        futures = [r.grammar_future for r in self.scheduler.waiting if not r.is_ready]
        if futures:
            concurrent.futures.wait(futures, timeout=0.1, return_when=concurrent.futures.FIRST_COMPLETED)

    def _prepare_draft_tokens(self, batch: list[ScheduledRequest], faults: Faults) -> SpecDecodeMetadata:
        """Fill the scheduled requests' draft slots (drafter, then forced tokens) and flatten them."""
        self.speculation.collect_drafts(batch, self.resources, faults)
        self.guided.use_forced(batch)
        return flatten_drafts(batch, self.vocab_size, self.runner.device)

    def _forward(self, batch: list[ScheduledRequest], faults: Faults) -> ForwardOutput | None:
        prompt_rows = [prompt_rows_of(s) for s in batch]
        seqs = [self._sequence_input(s, rows) for s, (_, rows) in zip(batch, prompt_rows)]
        start = time.perf_counter()
        try:
            output: ForwardOutput | None = self.runner.forward(seqs)
        except KVCacheLost:  # not one request's: no request alone can run on the pages it had
            raise
        except Exception:  # find the request(s) that break it: each alone (their K/V slots are their own)
            output = merge_outputs([self._forward_alone(s, seq, faults) for s, seq in zip(batch, seqs)], seqs)
        self.speculation.stats.target_time += time.perf_counter() - start
        self.speculation.stats.num_target_forwards += 1
        if output is not None and any(rows for _, rows in prompt_rows):
            output = take_prompt_logprobs(batch, output, prompt_rows, faults)
        return output

    def _sequence_input(self, s: ScheduledRequest, num_prompt_rows: int = 0) -> SequenceInput:
        r = s.request
        start = r.num_computed_tokens
        tokens = r.token_ids[start : start + s.num_new_tokens] + s.draft_token_ids
        num_rows = num_prompt_rows + (1 + len(s.draft_token_ids) if s.completes_sequence else 0)
        r.metrics.num_forwards += 1
        table = self.block_manager.block_tables[r.request_id]
        return SequenceInput(tokens, start, table, num_rows, s.draft_parents)

    def _forward_alone(self, s: ScheduledRequest, seq: SequenceInput, faults: Faults) -> ForwardOutput | None:
        try:
            return self.runner.forward([seq])
        except KVCacheLost:
            raise
        except Exception as exc:
            faults[s.request] = f"the model's forward failed on this request: {type(exc).__name__}: {exc}"
            return None

    def _wait_for_masks(self, faults: Faults):
        """The mask-ready event: the worker's masks for this step (None when nothing is guided)."""
        return self.guided.wait_masks(faults)

    def _apply_penalties(self, batch: list[ScheduledRequest], output: ForwardOutput) -> None:
        """Penalties, ``logit_bias`` and ``min_tokens`` on the rows of the requests that ask
        (`logit_stages.py`)."""
        apply_penalties_and_bias(batch, output, self.outputs.eos_token_ids)

    def _apply_masks(self, output: ForwardOutput, masks) -> None:
        self.guided.apply_masks(output.logits, masks)

    def _sample(
        self,
        batch: list[ScheduledRequest],
        output: ForwardOutput,
        drafts: SpecDecodeMetadata,
        masks,
        faults: Faults,
    ) -> list[Verification | None]:
        self.speculation.hand_target_tokens(batch, output)
        verifications = self.verifier.verify(batch, output, drafts, masks, faults)
        for s, v in zip(batch, verifications):  # token trees: the accepted branch's K/V into place
            if v is not None and s.accepted_path:
                r = s.request
                table = self.block_manager.block_tables[r.request_id]
                move_accepted_kv(self.runner.kv_cache, table, r.num_computed_tokens, s.accepted_path)
        return verifications

    def _compute_logprobs(
        self, batch, output: ForwardOutput, verifications, faults: Faults
    ) -> list[list[TokenLogprob] | None]:
        """Log-probabilities of the emitted tokens of the requests that ask (`logit_stages.py`)."""
        return emitted_logprobs(batch, output, verifications, faults)

    def _keep_hidden_states(
        self, batch: list[ScheduledRequest], output: ForwardOutput, verifications, faults: Faults
    ) -> None:
        """Verified positions' hidden states: the drafter's layers, and ``capture_hidden_layers``."""
        self.speculation.keep_hidden_states(batch, output, verifications)
        if self.capture_layers:
            for i, (s, v) in enumerate(zip(batch, verifications)):
                if s.request not in faults and (v is not None or not s.completes_sequence):
                    keep_verified_rows(s.request.captured_hidden, s, v, output, i, self.capture_layers)

    def _update_requests(
        self,
        batch: list[ScheduledRequest],
        verifications: list[Verification | None],
        logprobs: list[list[TokenLogprob] | None],
        faults: Faults,
    ) -> dict[RequestState, list[int]]:
        """Append each request's emitted tokens (and their log-probabilities) and check its stop
        conditions; returns the tokens kept."""
        kept: dict[RequestState, list[int]] = {}
        observed = []
        for s, v, entries in zip(batch, verifications, logprobs):
            r = s.request
            if r in faults:
                continue
            r.num_computed_tokens += s.num_new_tokens
            if v is None:  # a mid-prompt chunk
                continue
            if r.sampling_params.max_tokens == 0:  # the prompt scored (prompt_logprobs): no output
                r.finish_reason = FinishReason.LENGTH
                continue
            try:
                kept[r] = self._append_verified(s, v, entries)
            except Exception as exc:  # its grammar (or its stop strings) broke on these tokens
                faults[r] = f"could not take the verified tokens: {type(exc).__name__}: {exc}"
                continue
            observed.append((s, v.num_accepted))
        self.speculation.observe(observed)
        return kept

    def _append_verified(
        self, s: ScheduledRequest, v: Verification, logprobs: list[TokenLogprob] | None
    ) -> list[int]:
        r = s.request
        r.num_computed_tokens += v.num_accepted  # accepted drafts' K/V were written by this forward
        if r.num_output_tokens:  # a decode step (the first token comes from prefill)
            r.metrics.record_verification(len(s.draft_token_ids), v.num_accepted)
        tokens, grammar_complete = self.guided.after_verification(s, v.num_accepted, v.token_ids)
        kept = self.outputs.append_tokens(r, tokens)
        if logprobs is not None:
            r.logprobs.extend(logprobs[: len(kept)])  # (a stop may cut the tokens kept)
        if grammar_complete and r.finish_reason is None:
            r.finish_reason = FinishReason.STOP
        return kept

    def _free_resources(
        self,
        batch: list[ScheduledRequest],
        verifications: list[Verification | None],
        faults: Faults,
        kept: dict[RequestState, list[int]],
    ) -> None:
        """Register the pages now full of verified tokens (prefix caching), rewind the slots of rejected
        drafts; finish (and free) finished and failed requests."""
        for s, v in zip(batch, verifications):
            r = s.request
            if r not in faults:
                self.block_manager.register(r.request_id, r.token_ids, r.num_computed_tokens, r.cache_salt)
            if r in faults:
                self._finish_with_error(r, faults[r], kept.get(r, []))
            elif r.finish_reason is not None:
                self._finish(r, kept.get(r, []))
            else:
                num_rejected = s.num_draft_slots - (v.num_accepted if v else 0)
                if num_rejected:
                    self.block_manager.rewind(r.request_id, num_rejected)
                if v is not None:
                    self._events.append(self.outputs.make_event(r, kept.get(r, [])))

    # ---- finishing ----------------------------------------------------------------------------------
    def _finish(self, r: RequestState, new_tokens: list[int] | tuple = ()) -> None:
        """Check a guided output, free everything the request holds, emit its last event."""
        if r.metrics.finish_time is None:
            r.metrics.finish_time = time.perf_counter()
        if r.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
            try:
                self.guided.check_output(r, self.outputs.finalize_text(r))
            except Exception as exc:  # the verdict is information: it never costs the output
                r.guided_error = f"the output could not be checked: {type(exc).__name__}: {exc}"
        self.guided.release(r)
        self.scheduler.finish(r)
        self._released.append(r)
        self._events.append(self.outputs.make_event(r, list(new_tokens)))

    def _finish_with_error(self, r: RequestState, message: str, new_tokens: list[int] | tuple = ()) -> None:
        r.finish_reason, r.error = FinishReason.ERROR, message
        logger.warning("request %s: %s", r.request_id, message)
        self._finish(r, new_tokens)

    def _release_finished(self) -> None:
        """The drafter forgets this step's finished requests, in one guarded call."""
        if self._released:
            released, self._released = self._released, []
            self.speculation.release(released)

    def _fail_batch(self, batch: list[ScheduledRequest], exc: Exception) -> None:
        logger.error("a step failed outside any request's stage; its batch fails", exc_info=exc)
        self.guided.drain()
        for s in batch:
            if not s.request.is_finished:
                self._finish_with_error(
                    s.request, f"internal error in this step: {type(exc).__name__}: {exc}"
                )

    def _fail_holders_of_pages(self, exc: KVCacheLost) -> None:
        """The runner lost every page's K/V: each running request (all hold pages) fails with the cause,
        and no cached page is reused; waiting requests hold none and run later."""
        logger.error("the model runner lost its KV cache: %s", exc)
        self.guided.drain()
        for r in list(self.scheduler.running):
            if not r.is_finished:
                self._finish_with_error(r, f"the model's forward failed: {type(exc).__name__}: {exc}")
        self.block_manager.drop_cached()

    def _requeue_batch(self, batch: list[ScheduledRequest]) -> None:
        """An interrupted step: its requests go back to be recomputed from their tokens (preempted), their
        grammar matchers rebuilt from their output, their drafter state dropped."""
        self.guided.drain()
        for s in batch:
            r = s.request
            if r.is_finished:
                continue
            if r.finish_reason is not None:
                self._finish(r)
                continue
            self.scheduler.preempt(r)
            r.drafting_grammar = None
            self.guided.release(r)
            self._released.append(r)
        self._release_finished()
