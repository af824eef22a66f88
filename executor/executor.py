"""The front of the executor: what callers use. It validates and submits requests, runs or streams them
through the one shared loop (`caller_loop.py`, any number of threads at once), aborts them, and shuts
the executor down. The step loop itself is the `EngineCore` (`engine_core.py`); loading and sizing are
in `engine_setup.py`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

from ..drafters.base import Drafter
from ..plugins import get_plugin_manager
from ..sampling import SamplingParams
from .auto_defaults import resolve_auto_defaults
from .caller_loop import Caller, CallerLoop
from .config import ExecutorConfig
from .engine.inputs import (
    InvalidRequestError,
    as_request,
    check_cache_salt,
    check_length,
    check_token_ids,
    tokenize_prompt,
)
from .engine.request import FinishReason, Prompt, Request, RequestOutput, RequestState, TokenEvent
from .engine.scratch_forward import scratch_forward
from .engine_setup import build_engine_core, check_before_loading, resolve_dtype
from .kernel_plan.measurement.budget import measuring_budget
from .kernel_plan.measurement.journal import MeasurementNote, measurement_notes
from .layers.quantized.release_memory import trim_freed_heap
from .model.model_runner import ModelRunner
from .warmup import warm_up

logger = logging.getLogger("specexec")


class Executor:
    """Runs generation requests over a paged KV cache with continuous batching and speculation.

    ``model`` is a path (HF directory or GGUF file), None for the embedded SmolLM2-135M-Instruct,
    or an already loaded ``PreTrainedModel`` (then pass its ``tokenizer``, or submit token ids).
    Every bad config key or drafter option is refused (ValueError) before any model loads. Use it as a
    context manager, or call `close()`, to stop its worker threads.
    """

    def __init__(
        self,
        model=None,
        config: ExecutorConfig | None = None,
        *,
        tokenizer=None,
        drafter: Drafter | None = None,
    ) -> None:
        #: the config as it runs: ``quantization`` and ``speculative_config`` resolved (never "auto";
        #: the config passed in is left as it was), with the reasons in ``setup.auto_choices``
        self.config, auto_choices = resolve_auto_defaults(
            model, config or ExecutorConfig(), drafter is not None
        )
        config = self.config
        plugins = get_plugin_manager()
        drafter = check_before_loading(model, config, drafter, plugins)
        notes = len(measurement_notes())
        with measuring_budget(config.measuring_budget_s):
            self.core, setup = build_engine_core(
                model, config, tokenizer, drafter, plugins, resolve_dtype(model, config)
            )
        _say_what_was_not_measured(measurement_notes(notes))
        setup.auto_choices = auto_choices
        setup.warmup_seconds = warm_up(self.core) if config.warmup else None
        #: what start-up chose and measured, and why (`SetupReport`: dtype_choice, quantization,
        #: model_impl, kernel_plan, cuda_graphs, auto_choices, warmup_seconds)
        self.setup = setup
        trim_freed_heap()  # what the start-up measurements and the warm-up freed goes back to the system
        self._loop = CallerLoop(self.core)
        self._direct = Caller()  # requests submitted with add_request(), whose events step() returns
        self._ids = itertools.count()
        self._closed = False

    # what callers and tools read
    model = property(lambda self: self.core.runner.model)
    tokenizer = property(lambda self: self.core.outputs.tokenizer)
    block_manager = property(lambda self: self.core.block_manager)
    speculation = property(lambda self: self.core.speculation)  # .drafter, .stats
    guided = property(lambda self: self.core.guided)  # .stats, .pool

    # ---- submitting -------------------------------------------------------------------------------
    def add_request(
        self, request: Request | Prompt, sampling_params: SamplingParams | None = None
    ) -> RequestState:
        """Queue one request; its events come back from `step()`. A bad one is finished at once with
        ``finish_reason="error"``. With ``n`` > 1 every sample is queued; sample 0's state is returned."""
        return self.submit(request, sampling_params, self._direct, streaming=False)[0]

    def submit(
        self,
        request: Request | Prompt,
        sampling_params: SamplingParams | None,
        caller: Caller,
        *,
        streaming: bool,
    ) -> list[RequestState]:
        """Queue a request for ``caller`` (its events go to ``caller.events``); its samples' states. A bad
        request is finished at once with ``finish_reason="error"``. A request with ``n`` > 1 becomes n
        requests ``<id>#<i>``, sample i seeded with seed + i (the prompt is computed for each); any other
        request is submitted as it is (and checked there)."""
        request = as_request(request, sampling_params or SamplingParams())
        params = request.sampling_params
        n = getattr(params, "n", 1)
        if not isinstance(params, SamplingParams) or not isinstance(n, int) or isinstance(n, bool) or n <= 1:
            return [self._submit(request, None, caller, streaming)]
        if n > 64:  # (validate() says so, naming n)
            return [self._submit(request, None, caller, streaming)]
        base_id = request.request_id or f"req-{next(self._ids)}"
        samples = []
        for i in range(n):
            seed = None if params.seed is None else params.seed + i
            sample = replace(
                request, sampling_params=replace(params, n=1, seed=seed), request_id=f"{base_id}#{i}"
            )
            state = self._submit(sample, None, caller, streaming)
            state.sample_index = i
            samples.append(state)
        return samples

    def _output_of(self, samples: list[RequestState]) -> RequestOutput:
        """One request's output: its only sample's, or with n > 1 sample 0's under the request's id with
        every sample in ``samples``."""
        outputs = [self.core.outputs.make_output(s) for s in samples]
        if len(outputs) == 1:
            return outputs[0]
        return replace(outputs[0], request_id=samples[0].request_id.rpartition("#")[0], samples=outputs)

    def _submit(
        self,
        request: Request | Prompt,
        sampling_params: SamplingParams | None,
        caller: Caller,
        streaming: bool,
    ) -> RequestState:
        self._check_open()
        request = as_request(request, sampling_params or SamplingParams())
        params = request.sampling_params
        state = RequestState(
            request_id=request.request_id or f"req-{next(self._ids)}",
            token_ids=[],
            num_prompt_tokens=0,
            sampling_params=params,
            cache_salt=request.cache_salt,
            is_streaming=streaming,
        )
        if not self._loop.claim(state.request_id, caller):
            return self._refuse(
                state, caller, f"request_id {state.request_id!r} is already in use", claimed=False
            )
        try:
            if not isinstance(params, SamplingParams):
                raise InvalidRequestError(
                    f"sampling_params must be SamplingParams, got {type(params).__name__}"
                )
            params.validate()
            check_cache_salt(request.cache_salt)
            state.token_ids = tokenize_prompt(
                request.prompt,
                self.tokenizer,
                self.core.vocab_size,
                request.tools,
                add_special_tokens=request.add_special_tokens,
                template_kwargs=request.chat_template_kwargs,
            )
            check_token_ids(params.logit_bias, self.core.vocab_size, "logit_bias")
            state.num_prompt_tokens = state.metrics.num_prompt_tokens = len(state.token_ids)
            if params.prompt_logprobs is not None:
                state.prompt_logprobs = [None]  # the first prompt token: nothing scores it
            check_length(state.num_prompt_tokens, self.core.max_model_len)
            state.generator = params.make_generator(self.core.runner.device)
            if request.response_format is not None:
                self.core.guided.submit(state, request.response_format)  # compiles off the loop
        except ValueError as exc:  # InvalidRequestError, GrammarError, SamplingParams.validate's errors
            return self._refuse(state, caller, str(exc))
        self.core.add_request(state)
        return state

    def _refuse(
        self, state: RequestState, caller: Caller, message: str, claimed: bool = True
    ) -> RequestState:
        """A request that cannot run: finished at once, alone, with its error."""
        if claimed:
            self._loop.unclaim(state.request_id)
        state.finish_reason, state.error = FinishReason.ERROR, message
        state.is_invalid_request = True
        state.metrics.finish_time = state.metrics.arrival_time
        caller.events.put(self.core.outputs.make_event(state, []))
        return state

    # ---- running ----------------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        """One step of the shared loop; returns the events of requests queued with `add_request`."""
        self._check_open()
        self._loop.step()
        return self._direct.drain()

    def run(
        self, requests: Iterable[Request | Prompt], sampling_params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        """Run requests to completion; outputs come back in the order the requests were given. An
        interrupt (Ctrl-C) aborts this call's requests before it propagates."""
        caller = Caller()
        try:
            groups = [self.submit(r, sampling_params, caller, streaming=False) for r in requests]
            for _ in self._loop.drive(caller):
                pass
        except BaseException:
            self._loop.cancel(caller)
            raise
        return [self._output_of(samples) for samples in groups]

    def stream(
        self, requests: Iterable[Request | Prompt], sampling_params: SamplingParams | None = None
    ) -> Iterator[TokenEvent]:
        """Run requests, yielding each request's new tokens and text as they are generated. Closing
        (or dropping) the generator aborts what is left of its requests."""
        caller = Caller()
        try:
            for r in requests:
                self.submit(r, sampling_params, caller, streaming=True)
            yield from self._loop.drive(caller)
        finally:
            if caller.unfinished:
                self._loop.cancel(caller)

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

    def abort_request(self, request_id: str) -> bool:
        """Cancel a waiting or running request: it finishes with ``finish_reason="abort"`` and its KV
        pages, grammar and drafter state are freed at once (after the step in flight, if any). False when
        no unfinished request has that id. The id of a request with n > 1 aborts all its samples."""
        if self._loop.abort(request_id):
            return True
        samples = [rid for rid in self._loop.unfinished_ids() if rid.rpartition("#")[0] == request_id]
        return any([self._loop.abort(rid) for rid in samples])

    # ---- what a front that drives the loop itself uses (AsyncExecutor, the server) ----------------
    @property
    def max_model_len(self) -> int:
        """The longest prompt + output a request may have, in tokens."""
        return self.core.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.core.vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The token ids that end a request (the tokenizer's and the generation config's)."""
        return self.core.outputs.eos_token_ids

    @property
    def kv_cache_bytes(self) -> int:
        """The target's KV page pool, in bytes."""
        return self.core.runner.kv_cache.kv.nbytes

    @property
    def broadcast_seconds(self) -> float:
        """With tensor parallelism, the seconds rank 0 spent sending steps to the other ranks (0.0 on
        one process)."""
        return float(getattr(self.core.runner, "broadcast_seconds", 0.0))

    # ---- what tools that time or capture the forward use (bench/profile_step.py, graph_bench.py) -----
    @property
    def model_runner(self) -> ModelRunner:
        """The target's runner: its model, device and captured graphs, and `ModelRunner.wrapped_forward`
        for a tool that times the model call."""
        return self.core.runner

    def capture_forwards(self, backend) -> list:
        """Capture every model's decode/verify forward (the target's and a draft model's) with the capture
        ``backend`` (`executor/model/cuda_graphs.py`: CUDA graphs, or `EagerReplay`, their CPU stand-in),
        so later steps run through the captured path; the reports, also in ``setup.cuda_graphs``."""
        from .engine_setup import capture_cuda_graphs

        self.setup.cuda_graphs = capture_cuda_graphs(
            self.config, self.core.runner, self.speculation.drafter, self.core.max_model_len, backend
        )
        return self.setup.cuda_graphs

    def queue_sizes(self) -> tuple[int, int]:
        """(waiting, running) requests, a snapshot."""
        return self.core.queue_sizes()

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished()

    def cancel(self, caller: Caller) -> None:
        """Abort every unfinished request of ``caller`` and free the ids it claimed."""
        self._loop.cancel(caller)

    def advance(self) -> None:
        """One step of the shared loop, for a front that steps it from its own thread; each request's
        events go to its caller (unlike `step()`, which returns those of `add_request`)."""
        self._loop.step()

    def abort_all(self) -> None:
        """Abort every unfinished request, whoever submitted it."""
        self._loop.abort_all()

    def reset_prefix_cache(self) -> int:
        """Forget the cached prefix pages no request holds (benchmarks start each run cold); the number
        of pages dropped."""
        with self._loop.exclusive():
            return self.core.block_manager.drop_cached()

    def forget_finished_requests(self) -> None:
        """The drafter forgets what finished requests' outputs taught it (Suffix's shared index; with
        `reset_prefix_cache`, a benchmark's run then starts cold)."""
        with self._loop.exclusive():
            if (drafter := self.core.speculation.drafter) is not None:
                drafter.forget_finished_requests()

    def time_forward(self, num_tokens: int, context_len: int = 128) -> None:
        """One target forward over ``num_tokens`` new tokens after ``context_len`` cached ones."""
        with self._loop.exclusive():
            scratch_forward(self.core.runner, self.core.block_manager, num_tokens, context_len)

    # ---- shutting down ----------------------------------------------------------------------------
    def close(self) -> None:
        """Abort what is unfinished and stop the grammar compiler pool, the mask worker and the drafter's
        thread. Later calls raise RuntimeError."""
        if not self._closed:
            self._loop.abort_all()
            self._closed = True
            self.core.close()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Executor is closed")


def _say_what_was_not_measured(notes: list[MeasurementNote]) -> None:
    """One line for a start that took static defaults instead of measuring (`kernel_plan/static_defaults.py`)."""
    static = [note for note in notes if note.how.startswith("static default")]
    if static:
        why = sorted({note.how.removeprefix("static default (").rstrip(")") for note in static})
        logger.warning(
            "kernel plan: %s took this CPU level's static defaults (%s); the next quiet start or "
            "`specexec tune` measures them",
            ", ".join(note.kind for note in static), "; ".join(why),
        )  # fmt: skip
