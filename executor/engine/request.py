"""Requests: what a user submits (`Request`), the executor's state for it (`RequestState`), and what
comes back (`RequestOutput`, and `TokenEvent` when streaming)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ...sampling import SamplingParams
from ...sampling.logprobs import TokenLogprob

#: a prompt is text, token ids, or chat messages ({"role": ..., "content": ...})
Prompt = str | list[int] | list[dict[str, Any]]


@dataclass(slots=True)
class Request:
    """One generation request as the user gives it."""

    prompt: Prompt  #: text, token ids, or chat messages (rendered with the tokenizer's chat template)
    sampling_params: SamplingParams = field(default_factory=SamplingParams)  #: how to sample, when to stop
    request_id: str | None = None  #: any unique name; the executor numbers requests that have none
    #: guided decoding, OpenAI shape: {"type": "json_schema", "json_schema": {"schema": {...}}},
    #: {"type": "json_object"}; also {"type": "regex", "regex": ...}, {"type": "grammar", "grammar": EBNF
    #: or GBNF}, {"type": "choice", "choice": [strings]} (the output is one of them)
    response_format: dict | None = None
    #: OpenAI's tool objects ({"type": "function", "function": {name, description, parameters}}),
    #: rendered into a chat prompt by its template, or in the Hermes format (`tool_formats/`)
    tools: list[dict] | None = None
    #: a tenant's name for its cache namespace (vLLM's ``cache_salt``): the prefix-cache pages and the
    #: NGram/Suffix pools of requests with different salts are never shared (1..`MAX_CACHE_SALT_CHARS`
    #: characters; None: the unsalted namespace every unsalted request shares)
    cache_salt: str | None = None
    #: tokenize with the tokenizer's special tokens (BOS...): vLLM's ``add_special_tokens``. None: for a
    #: text prompt yes, for chat messages no (the template writes its own); token ids are taken as given
    add_special_tokens: bool | None = None
    #: the chat template's extra variables (``chat_template_kwargs`` of vLLM, SGLang and llama.cpp, e.g.
    #: ``{"enable_thinking": False}``); names `apply_chat_template` takes itself are refused
    chat_template_kwargs: dict[str, Any] | None = None


#: longest ``cache_salt`` taken (characters)
MAX_CACHE_SALT_CHARS = 256


class FinishReason(str, enum.Enum):
    STOP = "stop"  #: EOS, a stop token, a stop string, or a guided output that is complete
    LENGTH = "length"  #: max_tokens or the model's context
    ERROR = "error"  #: this request failed (bad input, its grammar, its logits, ...); see `error`
    ABORT = "abort"  #: cancelled: `abort_request`, a closed stream, an interrupted `run`

    def __str__(self) -> str:  # print(out.finish_reason) shows "length", as the README does
        return self.value


@dataclass(slots=True)
class RequestMetrics:
    """Timings (seconds, `time.perf_counter`) and counts for one request."""

    num_prompt_tokens: int = 0  #: tokens in the rendered prompt
    num_output_tokens: int = 0  #: tokens generated
    arrival_time: float = 0.0  #: when the executor accepted it
    first_token_time: float | None = None  #: when its first output token was sampled
    finish_time: float | None = None  #: when it finished
    num_forwards: int = 0  #: target forwards it took part in
    #: prompt tokens whose K/V came from the prefix cache at its admission (OpenAI's cached_tokens)
    num_cached_tokens: int = 0
    num_preemptions: int = 0  #: times its pages were taken back and its tokens recomputed
    num_decode_steps: int = 0  #: forwards that verified drafts or decoded one token
    num_draft_tokens: int = 0  #: draft tokens proposed and verified
    num_accepted_tokens: int = 0  #: draft tokens the target accepted
    #: [max_draft_len] how often the draft token at position i was proposed / accepted
    proposed_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)

    num_grammar_rejected_drafts: int = 0  #: drafts rejected because the grammar forbids them
    num_target_rejected_drafts: int = 0  #: grammar-valid drafts the target rejected
    mask_build_ms: float = 0.0  #: grammar mask building (on the worker thread), this request's share
    mask_wait_ms: float = 0.0  #: time the loop waited for masks after the forward, this request's share
    num_mask_rows_skipped: int = 0  #: verify rows that needed no mask (after a grammar-rejected draft)
    num_forced_tokens: int = 0  #: grammar-forced tokens (jump-forward) proposed as drafts

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens gained per decode step: accepted drafts plus the recovered or bonus token."""
        if not self.num_decode_steps:
            return None
        return (self.num_accepted_tokens + self.num_decode_steps) / self.num_decode_steps

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    def record_verification(self, num_drafts: int, num_accepted: int) -> None:
        self.num_decode_steps += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        if len(self.proposed_per_position) < num_drafts:
            grow = num_drafts - len(self.proposed_per_position)
            self.proposed_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for i in range(num_drafts):
            self.proposed_per_position[i] += 1
            self.accepted_per_position[i] += i < num_accepted

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def time_per_output_token(self) -> float | None:
        """Mean time between output tokens after the first."""
        if self.first_token_time is None or self.finish_time is None or self.num_output_tokens < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.num_output_tokens - 1)

    @property
    def latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time


@dataclass(slots=True)
class RequestOutput:
    """The result of one request."""

    request_id: str
    text: str  #: decoded output (a matched stop string is cut off)
    token_ids: list[int]  #: output token ids
    finish_reason: FinishReason
    prompt_token_ids: list[int] = field(default_factory=list)
    error: str | None = None  #: what was wrong, when finish_reason is "error"
    #: the error came from the request's own input (bad values, a grammar that does not compile)
    is_invalid_request: bool = False
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    #: guided requests: does the output match its schema (jsonschema) / regex / JSON object? None when
    #: unguided, when the request ended in error or abort, or when nothing can check it (EBNF grammars)
    guided_valid: bool | None = None
    guided_error: str | None = None  #: why the output does not match, when guided_valid is False
    #: what the caller should know, e.g. schema keywords that were not enforced (guided_unsupported: warn)
    warnings: list[str] = field(default_factory=list)
    #: with ``capture_hidden_layers``: [num_prompt + num_output - 1, num_layers * hidden] hidden states of
    #: every position fed to the model (the last token never is), the layers concatenated in config order
    hidden_states: torch.Tensor | None = None
    #: with ``SamplingParams.logprobs``: one entry per output token (`sampling/logprobs.py` says which
    #: log-probabilities); None when not asked for
    logprobs: list[TokenLogprob] | None = None
    #: with ``SamplingParams.prompt_logprobs``: one entry per prompt token, None for the first (nothing
    #: scores it); None when not asked for
    prompt_logprobs: list[TokenLogprob | None] | None = None
    #: with ``SamplingParams.n`` > 1: every sample's output, in order (this output is sample 0's, with the
    #: request's own id); empty otherwise
    samples: list[RequestOutput] = field(default_factory=list)
    sample_index: int = 0  #: which of the request's ``n`` samples this is


@dataclass(slots=True)
class TokenEvent:
    """Streaming: the tokens one request gained in one step."""

    request_id: str
    token_ids: list[int]  #: new token ids
    text: str  #: new text (held back while it ends inside a multi-byte character)
    finished: bool = False
    output: RequestOutput | None = None  #: the full output, on the event that finishes the request
    logprobs: list[TokenLogprob] | None = None  #: the new tokens' entries, when the request asked
    sample_index: int = 0  #: with n > 1: which sample (its request_id is ``<id>#<sample_index>``)
    num_prompt_tokens: int = 0  #: the request's prompt tokens (0 for one refused before tokenizing)


class RequestStatus(enum.Enum):
    WAITING = enum.auto()  #: not scheduled yet, or preempted (to recompute)
    RUNNING = enum.auto()  #: holds KV pages
    FINISHED = enum.auto()


@dataclass(eq=False)
class RequestState:
    """The executor's view of a request: its tokens, its progress through the cache, its stop state."""

    request_id: str
    token_ids: list[int]  #: prompt followed by output
    num_prompt_tokens: int
    sampling_params: SamplingParams
    generator: torch.Generator | None = None
    #: the request's ``cache_salt``: which prefix-cache pages and drafter pools it may read and feed
    cache_salt: str | None = None
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0  #: tokens whose K/V are in the cache
    finish_reason: FinishReason | None = None
    error: str | None = None
    #: its error came from its own input (refused when submitted, a grammar that does not compile): a
    #: server answers 400 for it, 500 for any other error
    is_invalid_request: bool = False
    is_streaming: bool = False  #: its events carry text deltas (stream())
    grammar_spec: Any = None  #: GrammarSpec of its response_format as given (checked against at the end)
    grammar_future: Any = None  #: Future of the compiled grammar, for guided requests
    grammar_deadline: float = float("inf")  #: `time.perf_counter()` after which its compile has failed
    grammar: Any = None  #: RequestGrammar once compiled
    grammar_fill: Any = None  #: this step's RowFill (which rows were masked)
    drafting_grammar: Any = None  #: this step's GrammarSnapshot for the drafter (a fork, never the matcher)
    guided_valid: bool | None = None  #: the finished output checked against grammar_spec
    guided_error: str | None = None
    guided_warnings: list[str] = field(default_factory=list)
    forced_token_ids: list[int] = field(default_factory=list)  #: this step's grammar-forced tokens
    #: verified positions' target hidden states not yet read by the drafter, for drafters that ask for
    #: them (EAGLE-3): chunks (position of the first row, [rows, num_layers * hidden])
    target_hidden: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    #: for a drafter with ``wants_target_tokens``: the last step's (drafts, the target's greedy token at
    #: each of its rows: the root's, then each draft's), in the order the drafter proposed them
    target_tokens: tuple[list[int], list[int]] | None = None
    #: with ``capture_hidden_layers``: every verified position's hidden states, kept for the output
    captured_hidden: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    text: str = ""  #: decoded output, kept up to date only when needed (stop strings, streaming)
    num_text_sent: int = 0  #: characters of `text` already streamed
    sample_index: int = 0  #: with n > 1: which sample of its request it is
    #: with ``logprobs``: one entry per output token so far (`sampling/logprobs.py`)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    #: with ``prompt_logprobs``: one entry per prompt token scored so far, None for the first
    #: (`sampling/prompt_logprobs.py`); empty otherwise
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    metrics: RequestMetrics = field(default_factory=RequestMetrics)

    def __post_init__(self) -> None:
        self.metrics.num_prompt_tokens = self.num_prompt_tokens
        self.metrics.arrival_time = time.perf_counter()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def is_ready(self) -> bool:
        """False while its grammar is still compiling."""
        return self.grammar_future is None or self.grammar is not None

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens
