"""The executor loop. One `step()` runs the stages of the speculative design, each a short method:

_prepare_draft_requests  reserve draft slots (hook relay)   _schedule          batch + KV pages
_prepare_draft_tokens    drafter fills drafts (hook relay)  _forward           one target forward
_wait_for_masks          grammar masks ready                _sample            pick / verify tokens
_update_requests         append tokens, stop checks         _free_resources    rewind, release
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..drafters.base import Drafter, DrafterContext
from ..plugins import get_plugin_manager
from ..sampling import SamplingParams
from ..sampling.rejection import RejectionSampler, Verification
from .block_manager import BlockManager
from .config import ExecutorConfig
from .draft_length import (
    MEASURED_SIZES,
    DraftLengthPolicy,
    ForwardCostModel,
    cost_cache_key,
    default_cache_dir,
)
from .guided import GuidedDecodingStage
from .inputs import InvalidRequestError, as_request, check_length, tokenize_prompt
from .kv_cache import KVCache, KVCacheSpec, num_blocks_for_budget
from .model_runner import ForwardOutput, ModelRunner, SequenceInput
from .output_processor import OutputProcessor
from .request import FinishReason, Prompt, Request, RequestOutput, RequestState, TokenEvent
from .scheduler import ScheduledRequest, Scheduler
from .speculation import SpeculationStage, build_drafter, find_drafter_factory, keep_verified_rows

logger = logging.getLogger("specexec")


@dataclass(slots=True)
class StepResources:
    """What drafters may use during a step."""

    target: ModelRunner  #: the target model's runner (its KV cache, captured hidden states)
    tokenizer: object | None
    vocab_size: int  #: the target's vocabulary size


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _eos_token_ids(model, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    for value in (
        getattr(model.generation_config, "eos_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(value)
    return frozenset(ids)


class Executor:
    """Runs generation requests over a paged KV cache with continuous batching.

    ``model`` is a path (HF directory or GGUF file), None for the embedded SmolLM2-135M-Instruct,
    or an already loaded ``PreTrainedModel`` (then pass its ``tokenizer``, or submit token ids).
    """

    def __init__(
        self,
        model=None,
        config: ExecutorConfig | None = None,
        *,
        tokenizer=None,
        drafter: Drafter | None = None,
    ) -> None:
        self.config = config = config or ExecutorConfig()
        self.plugins = get_plugin_manager()
        if config.speculative_config is not None and drafter is None:
            find_drafter_factory(config.speculative_config, self.plugins)  # fail before loading a model
        self.model, self.tokenizer = self._load(model, tokenizer)
        device = next(self.model.parameters()).device
        spec = KVCacheSpec.from_model_config(self.model.config, next(self.model.parameters()).dtype)
        num_blocks = config.num_kv_blocks or num_blocks_for_budget(
            spec, config.block_size, int(config.kv_cache_memory_gb * 2**30)
        )
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.kv_cache = KVCache(spec, num_blocks, config.block_size, device)
        self.runner = ModelRunner(
            self.model, self.kv_cache, config.max_num_tokens, tuple(config.capture_hidden_layers)
        )
        self.scheduler = Scheduler(self.block_manager, config.max_batch_size, config.max_num_tokens)
        self.vocab_size = self.model.config.get_text_config().vocab_size
        self.speculation = self._setup_speculation(drafter)
        self.max_model_len = self._max_model_len()
        self.output_processor = OutputProcessor(self.tokenizer, self.max_model_len)
        self.rejection_sampler = RejectionSampler()
        self.resources = StepResources(self.runner, self.tokenizer, self.vocab_size)
        self.eos_token_ids = _eos_token_ids(self.model, self.tokenizer)
        self.guided = GuidedDecodingStage(
            self.tokenizer,
            self.vocab_size,
            self.eos_token_ids,
            config.max_num_tokens,
            device,
            config.guided_json_max_whitespace,
        )
        self._ids = itertools.count()
        self._streaming = False
        self._pending_events: list[TokenEvent] = []

    def _load(self, model, tokenizer):
        if isinstance(model, torch.nn.Module):
            return model.eval(), tokenizer
        from .model_loader import load_model

        cfg = self.config
        loaded = load_model(
            model if model is not None else cfg.model,
            dtype=cfg.dtype,
            device=str(_resolve_device(cfg.device)),
            device_map=cfg.device_map,
            cache_dir=cfg.cache_dir,
        )
        logger.info("loaded %s", loaded.source)
        return loaded.model, tokenizer or loaded.tokenizer

    def _setup_speculation(self, drafter: Drafter | None) -> SpeculationStage:
        spec = self.config.speculative_config
        if drafter is None and spec is not None:
            context = DrafterContext(self.model, self.tokenizer, self.vocab_size, self.config)
            drafter = build_drafter(spec, context, self.plugins)
        if drafter is None:
            return SpeculationStage(self.plugins, None, spec, self.vocab_size)
        if not isinstance(drafter, Drafter):
            raise ValueError(f"drafter must be a specexec Drafter, got {type(drafter).__name__}")
        self.plugins.register(drafter, name="drafter")
        drafter.use_grammar_masks = self.config.draft_side_grammar_masks
        self.runner.capture(tuple(drafter.hidden_state_layers))
        policy = None
        if spec is not None and spec.draft_len_policy != "fixed":
            cost = ForwardCostModel.linear()
            if spec.draft_len_policy == "auto":
                cache_dir = Path(self.config.cache_dir) if self.config.cache_dir else default_cache_dir()
                limit = min(self.config.max_num_tokens, self.block_manager.capacity_tokens)
                sizes = tuple(n for n in MEASURED_SIZES if n <= limit) or (1,)
                cost = ForwardCostModel.cached(
                    cost_cache_key(self.model), self.time_forward, cache_dir, sizes
                )
            policy = DraftLengthPolicy(drafter.max_draft_len, cost)
        return SpeculationStage(self.plugins, drafter, spec, self.vocab_size, policy)

    def time_forward(self, num_tokens: int, context_len: int = 128) -> None:
        """One target forward over ``num_tokens`` new tokens after ``context_len`` cached ones (for the
        cost model; the scratch pages are freed at once)."""
        scratch = "__forward_cost__"
        context_len = max(0, min(context_len, self.block_manager.capacity_tokens - num_tokens))
        self.block_manager.allocate(scratch, context_len + num_tokens)
        try:
            table = self.block_manager.block_tables[scratch]
            self.runner.forward([SequenceInput([0] * num_tokens, context_len, table, num_tokens)])
        finally:
            self.block_manager.free(scratch)

    def _max_model_len(self) -> int:
        text_config = self.model.config.get_text_config()
        model_len = (
            self.config.max_model_len or getattr(text_config, "max_position_embeddings", None) or 2**31
        )
        pool_len = self.block_manager.capacity_tokens - self.speculation.max_draft_len - 1
        if pool_len < model_len:
            logger.info(
                "context capped at %d tokens by the KV pool (%d pages)",
                pool_len,
                self.block_manager.num_blocks,
            )
        return min(model_len, pool_len)

    # ---- submitting -------------------------------------------------------------------------------
    def add_request(
        self, request: Request | Prompt, sampling_params: SamplingParams | None = None
    ) -> RequestState:
        """Queue one request; a bad one is finished at once with ``finish_reason="error"``."""
        request = as_request(request, sampling_params or SamplingParams())
        params = request.sampling_params
        state = RequestState(
            request_id=request.request_id or f"req-{next(self._ids)}",
            token_ids=[],
            num_prompt_tokens=0,
            sampling_params=params,
            eos_token_ids=self.eos_token_ids,
        )
        try:
            if not isinstance(params, SamplingParams):
                raise InvalidRequestError(
                    f"sampling_params must be SamplingParams, got {type(params).__name__}"
                )
            params.validate()
            if request.request_id is not None and self.scheduler.has_request(request.request_id):
                raise InvalidRequestError(f"request_id {request.request_id!r} is already in use")
            state.token_ids = tokenize_prompt(request.prompt, self.tokenizer, self.vocab_size)
            state.num_prompt_tokens = state.metrics.num_prompt_tokens = len(state.token_ids)
            check_length(state.num_prompt_tokens, self.max_model_len)
            state.generator = params.make_generator(self.kv_cache.kv.device)
            if request.response_format is not None:
                self.guided.submit(state, request.response_format)  # compiles off the loop
        except ValueError as exc:  # InvalidRequestError, and SamplingParams.validate's errors
            self._finish_with_error(state, str(exc))
            return state
        self.scheduler.add(state)
        return state

    def _finish_with_error(self, state: RequestState, message: str) -> None:
        state.finish_reason, state.error = FinishReason.ERROR, message
        self.scheduler.finish(state)
        state.metrics.finish_time = state.metrics.arrival_time
        logger.warning("request %s: %s", state.request_id, message)
        self._pending_events.append(self.output_processor.make_event(state, [], self._streaming))

    # ---- running ----------------------------------------------------------------------------------
    def run(
        self, requests: Iterable[Request | Prompt], sampling_params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        """Run requests to completion; outputs come back in the order the requests were given."""
        states = [self.add_request(r, sampling_params) for r in requests]
        while self.scheduler.has_unfinished():
            self.step()
        self._pending_events.clear()
        return [self.output_processor.make_output(s) for s in states]

    def stream(
        self, requests: Iterable[Request | Prompt], sampling_params: SamplingParams | None = None
    ) -> Iterator[TokenEvent]:
        """Run requests, yielding each request's new tokens and text as they are generated."""
        self._streaming = True
        added = []
        try:
            for r in requests:
                added.append(self.add_request(r, sampling_params))
            while self._pending_events or self.scheduler.has_unfinished():
                yield from self.step()
        finally:
            self._streaming = False
            for state in added:  # the consumer stopped early: cancel what is left
                if not state.is_finished:
                    self.scheduler.finish(state)
                    self.speculation.release(state)
            self._pending_events.clear()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Convenience: one prompt or a list, with one SamplingParams for all or one each."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], (int, dict))):
            prompts = [prompts]  # a single prompt
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling_params)} sampling params")
        return self.run(Request(p, sp) for p, sp in zip(prompts, sampling_params))

    def step(self) -> list[TokenEvent]:
        """One iteration of the loop; returns the token events it produced."""
        self._prepare_draft_requests()
        batch = self._schedule()
        events, self._pending_events = self._pending_events, []
        if not batch:
            self._wait_for_grammars()
            return events
        self._prepare_draft_tokens(batch)
        self.guided.start_masks(batch)  # the mask worker builds the grammar masks during the forward
        output = self._forward(batch)
        self._wait_for_masks(output)
        verifications = self._sample(batch, output)
        self.speculation.keep_hidden_states(batch, output, verifications)
        self._keep_captured_hidden(batch, output, verifications)
        events += self._update_requests(batch, verifications)
        self._free_resources(batch, verifications)
        return events

    # ---- the stages -------------------------------------------------------------------------------
    def _prepare_draft_requests(self) -> None:
        self.speculation.reserve_slots(self.scheduler.running, self.max_model_len)
        self.guided.reserve_forced(self.scheduler.running, self.max_model_len)

    def _schedule(self) -> list[ScheduledRequest]:
        for state, message in self.guided.resolve(list(self.scheduler.waiting)):
            self._finish_with_error(state, message)
        return self.scheduler.schedule()

    def _wait_for_grammars(self) -> None:
        """Nothing could run: block briefly on the grammars still compiling instead of spinning."""
        futures = [r.grammar_future for r in self.scheduler.waiting if not r.is_ready]
        if futures:
            concurrent.futures.wait(futures, timeout=0.1, return_when=concurrent.futures.FIRST_COMPLETED)

    def _prepare_draft_tokens(self, batch: list[ScheduledRequest]) -> None:
        self.speculation.collect_drafts(batch, self.resources)
        self.guided.use_forced(batch)

    def _forward(self, batch: list[ScheduledRequest]) -> ForwardOutput:
        seqs = []
        for s in batch:
            r = s.request
            start = r.num_computed_tokens
            tokens = r.token_ids[start : start + s.num_new_tokens] + r.draft_token_ids
            num_rows = 1 + len(r.draft_token_ids) if s.completes_sequence else 0
            seqs.append(SequenceInput(tokens, start, self.block_manager.block_tables[r.request_id], num_rows))
            r.metrics.num_forwards += 1
        start = time.perf_counter()
        output = self.runner.forward(seqs)
        self.speculation.stats.target_time += time.perf_counter() - start
        self.speculation.stats.num_target_forwards += 1
        return output

    def _wait_for_masks(self, output: ForwardOutput) -> None:
        """Join the mask worker (the mask-ready event) and mask the logits of guided requests."""
        self.guided.apply_masks(output.logits)

    def _sample(self, batch: list[ScheduledRequest], output: ForwardOutput) -> list[Verification | None]:
        """Verify each request's drafts (none: just sample); None for a mid-prompt chunk."""
        producing = [i for i, s in enumerate(batch) if s.completes_sequence]
        if not producing:
            return [None] * len(batch)
        requests = [batch[i].request for i in producing]
        cu = output.cu_logit_rows  # mid-prompt chunks own no rows, so the producing offsets suffice
        verifications = self.rejection_sampler.verify_batch(
            output.logits,
            [cu[i] for i in producing] + [cu[producing[-1] + 1]],
            [r.draft_token_ids for r in requests],
            [r.draft_probs for r in requests],
            [r.sampling_params for r in requests],
            [r.generator for r in requests],
        )
        results: list[Verification | None] = [None] * len(batch)
        for i, v in zip(producing, verifications):
            results[i] = v
        return results

    def _keep_captured_hidden(self, batch, output: ForwardOutput, verifications) -> None:
        layers = tuple(self.config.capture_hidden_layers)
        if layers:
            for i, (s, v) in enumerate(zip(batch, verifications)):
                keep_verified_rows(s.request.captured_hidden, s, v, output, i, layers)

    def _update_requests(
        self, batch: list[ScheduledRequest], verifications: list[Verification | None]
    ) -> list[TokenEvent]:
        events = []
        for s, v in zip(batch, verifications):
            r = s.request
            r.num_computed_tokens += s.num_new_tokens
            if v is None:
                continue
            r.num_computed_tokens += v.num_accepted  # accepted drafts' K/V were written by this forward
            if r.num_output_tokens:  # a decode step (the first token comes from prefill)
                r.metrics.record_verification(len(r.draft_token_ids), v.num_accepted)
            kept = self.output_processor.append_tokens(r, v.token_ids)
            self.speculation.observe(r, len(r.draft_token_ids), v.num_accepted)
            if r.finish_reason is None:
                self.guided.after_verification(r, v.num_accepted, v.token_ids)
            if r.finish_reason is not None:
                r.metrics.finish_time = time.perf_counter()
            events.append(self.output_processor.make_event(r, kept, self._streaming))
        return events

    def _free_resources(
        self, batch: list[ScheduledRequest], verifications: list[Verification | None]
    ) -> None:
        for s, v in zip(batch, verifications):
            r = s.request
            num_rejected = s.num_draft_slots - (v.num_accepted if v else 0)
            if num_rejected and r.finish_reason is None:
                self.block_manager.rewind(r.request_id, num_rejected)
            if r.finish_reason is not None:
                self.scheduler.finish(r)
                self.speculation.release(r)
