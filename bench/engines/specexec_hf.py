"""The systems under test: specexec (any configuration) and the Hugging Face baselines.

Every engine takes the same prompts (token ids) and sampling settings and returns one
`RequestRecord` per request plus the wall time, so rows can be compared side by side.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ...executor.engine.request import FinishReason, Request, RequestOutput
from ...executor.executor import Executor
from ...prompt_sets.datasets import BenchPrompt
from ...sampling import SamplingParams
from ..records import RequestRecord, schema_valid
from ..workload.stop_tokens import num_stop_tokens


@dataclass(slots=True)
class Workload:
    prompts: list[BenchPrompt]
    token_ids: list[list[int]]  #: the prompts rendered with the chat template
    max_tokens: int
    temperature: float
    #: the stop set cannot be sampled and nothing ends a request before max_tokens (`stop_tokens.py`)
    ignore_eos: bool = False
    guided: bool = False  #: constrain outputs to each prompt's schema (prompts without one run free)
    tools: bool = False  #: send each prompt's messages with its tools (rendered by the executor)
    #: the one stop set every engine gets (`stop_tokens.find_stop_tokens`): each stops on the first of them,
    #: or with ``ignore_eos`` none can be sampled
    stop_token_ids: list[int] = field(default_factory=list)

    def sampling_params(self, i: int) -> SamplingParams:
        """specexec's: the stop set as stop tokens, and with ``ignore_eos`` none of them sampled before
        max_tokens (``min_tokens``: -inf; the library's ``ignore_eos`` alone would sample EOS and go on)."""
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=i,
            stop_token_ids=list(self.stop_token_ids),
            min_tokens=self.max_tokens if self.ignore_eos else 0,
        )


def chat_token_ids(tokenizer, prompts: list[BenchPrompt]) -> list[list[int]]:
    """Each prompt's messages rendered with the chat template, ready for generation."""
    return [
        list(
            tokenizer.apply_chat_template(
                p.messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for p in prompts
    ]


def _guided_verdict(out: RequestOutput) -> bool | None:
    """A guided request's schema verdict: the executor's own check of the finished output, and a request
    refused or failed (an unenforceable keyword, a grammar that admits nothing) counts as invalid."""
    if out.finish_reason is FinishReason.ERROR:
        return False
    return out.guided_valid


def record_of(
    prompt: BenchPrompt, out: RequestOutput, guided: bool = False, stop_token_ids: Sequence[int] = ()
) -> RequestRecord:
    m = out.metrics
    return RequestRecord(
        id=prompt.id,
        num_prompt_tokens=m.num_prompt_tokens,
        num_output_tokens=m.num_output_tokens,
        latency_ms=(m.latency or 0.0) * 1000,
        ttft_ms=None if m.time_to_first_token is None else m.time_to_first_token * 1000,
        tpot_ms=None if m.time_per_output_token is None else m.time_per_output_token * 1000,
        finish_reason=out.finish_reason.value,
        num_decode_steps=m.num_decode_steps,
        num_draft_tokens=m.num_draft_tokens,
        num_accepted_tokens=m.num_accepted_tokens,
        num_grammar_rejected_drafts=m.num_grammar_rejected_drafts,
        num_forced_tokens=m.num_forced_tokens,
        mask_wait_ms=m.mask_wait_ms,
        error=out.error,
        proposed_per_position=list(m.proposed_per_position),
        accepted_per_position=list(m.accepted_per_position),
        schema_valid=_guided_verdict(out)
        if guided and prompt.schema
        else schema_valid(out.text, prompt.schema),
        text=out.text,
        num_cached_tokens=m.num_cached_tokens,
        num_stop_tokens=num_stop_tokens(out.token_ids, stop_token_ids),
    )


def run_specexec(
    executor: Executor, work: Workload, concurrency: int, on_done: Callable[[], None] = lambda: None
) -> tuple[list[RequestRecord], float]:
    """Keep ``concurrency`` requests in flight until all are done; records in prompt order."""
    pending = deque(range(len(work.prompts)))
    in_flight: dict[str, int] = {}
    records: dict[int, RequestRecord] = {}
    start = time.perf_counter()
    while pending or in_flight:
        while pending and len(in_flight) < concurrency:
            i = pending.popleft()
            schema = work.prompts[i].schema if work.guided else None
            response_format = {"type": "json_schema", "json_schema": {"schema": schema}} if schema else None
            prompt = work.prompts[i]
            request = Request(
                prompt.messages if work.tools else work.token_ids[i],
                work.sampling_params(i),
                f"bench-{i}",
                response_format,
                prompt.tools if work.tools else None,
            )
            state = executor.add_request(request)
            in_flight[state.request_id] = i
        for event in executor.step():
            if event.finished and event.output is not None and event.request_id in in_flight:
                i = in_flight.pop(event.request_id)
                records[i] = record_of(work.prompts[i], event.output, work.guided, work.stop_token_ids)
                on_done()
    return [records[i] for i in sorted(records)], time.perf_counter() - start


class _FirstTokenTimer:
    """A `generate` streamer that notes when the first new tokens arrive (the first put is the prompt).
    Plain `generate` puts one token at a time; with ``assistant_model`` (batch 1, where transformers 5
    takes a streamer) each put is one verify step's accepted drafts and bonus token, so the first time
    is when the first step's tokens come out together."""

    def __init__(self) -> None:
        self.num_puts = 0
        self.first_token_time: float | None = None

    def put(self, value) -> None:
        self.num_puts += 1
        if self.num_puts == 2:
            self.first_token_time = time.perf_counter()

    def end(self) -> None:
        pass


def hf_grammar_processors(model, tokenizer, max_whitespace: int | None):
    """For a guided HF row: ``prompt -> [logits processor]``, xgrammar's transformers processor with the
    prompt's schema compiled as the executor compiles it (same whitespace limit); None for a prompt
    without a schema. A schema xgrammar cannot compile raises (that prompt's row records the error)."""
    import json

    import xgrammar as xgr
    from xgrammar.contrib.hf import LogitsProcessor

    from ...grammar.compiler import hf_tokenizer_info

    vocab = model.config.get_text_config().vocab_size
    eos = getattr(model.generation_config, "eos_token_id", None)
    stop_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in stop_ids:
        stop_ids.append(tokenizer.eos_token_id)
    compiler = xgr.GrammarCompiler(hf_tokenizer_info(tokenizer, vocab, stop_ids))

    def processors(prompt: BenchPrompt):
        if not prompt.schema:
            return None
        text = json.dumps(prompt.schema)
        if max_whitespace == 0:
            compiled = compiler.compile_json_schema(text, any_whitespace=False)
        else:
            compiled = compiler.compile_json_schema(text, max_whitespace_cnt=max_whitespace)
        return [LogitsProcessor(compiled)]  # one per generate() call: it keeps its matcher

    return processors


def run_hf_generate(
    model,
    tokenizer,
    work: Workload,
    generate_kwargs: dict,
    on_done: Callable[[], None] = lambda: None,
    processors: Callable[[BenchPrompt], list | None] | None = None,
) -> tuple[list[RequestRecord], float]:
    """HF `generate`, one request at a time (concurrency 1); ``processors`` gives each prompt its
    logits processors (the guided baseline). It stops on the workload's stop set, or with ``ignore_eos``
    suppresses it (-inf at every step, drafts' verification included)."""
    records = []
    stops = list(work.stop_token_ids)
    eos = None if work.ignore_eos or not stops else stops
    start_all = time.perf_counter()
    for i, (prompt, ids) in enumerate(zip(work.prompts, work.token_ids)):
        timer = _FirstTokenTimer()
        kwargs = dict(generate_kwargs)
        if work.temperature > 0:
            torch.manual_seed(i)
            kwargs.update(do_sample=True, temperature=work.temperature, top_k=0)
        else:
            kwargs.update(do_sample=False)
        if work.ignore_eos and stops:
            kwargs.update(suppress_tokens=stops)
        if processors is not None:
            try:
                kwargs["logits_processor"] = processors(prompt)
            except Exception as exc:  # a schema xgrammar cannot compile: the request fails, as ours would
                records.append(_failed_record(prompt, ids, f"{type(exc).__name__}: {exc}"))
                on_done()
                continue
        start = time.perf_counter()
        try:
            out = _generate(model, tokenizer, ids, work, timer, eos, kwargs)
        except Exception as exc:
            if processors is None:
                raise
            # e.g. xgrammar's processor asserting on a token its mask allowed none of: this request
            # fails, as the executor fails a request whose grammar admits no token
            records.append(_failed_record(prompt, ids, f"{type(exc).__name__}: {exc}"))
            on_done()
            continue
        end = time.perf_counter()
        out = _through_first_stop(out, eos or [])
        text = tokenizer.decode(out, skip_special_tokens=True)
        ttft = None if timer.first_token_time is None else (timer.first_token_time - start) * 1000
        tpot = (
            ((end - timer.first_token_time) * 1000 / (len(out) - 1))
            if ttft is not None and len(out) > 1
            else None
        )
        records.append(
            RequestRecord(
                id=prompt.id,
                num_prompt_tokens=len(ids),
                num_output_tokens=len(out),
                latency_ms=(end - start) * 1000,
                ttft_ms=ttft,
                tpot_ms=tpot,
                finish_reason="stop" if eos and out and out[-1] in eos else "length",
                schema_valid=schema_valid(text, prompt.schema),
                text=text,
                num_stop_tokens=num_stop_tokens(out, stops),
            )
        )
        on_done()
    return records, time.perf_counter() - start_all


def _through_first_stop(out: list[int], stops: list[int]) -> list[int]:
    """The output up to and including its first stop token (all of it when there is none)."""
    first = next((k for k, t in enumerate(out) if t in stops), None)
    return out if first is None else out[: first + 1]


def _generate(model, tokenizer, ids: list[int], work: Workload, timer, eos, kwargs: dict) -> list[int]:
    with torch.inference_mode():
        return model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=work.max_tokens,
            streamer=timer,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            eos_token_id=eos,
            **kwargs,
        )[0, len(ids) :].tolist()


def _failed_record(prompt: BenchPrompt, ids: list[int], error: str) -> RequestRecord:
    return RequestRecord(
        id=prompt.id,
        num_prompt_tokens=len(ids),
        num_output_tokens=0,
        latency_ms=0.0,
        ttft_ms=None,
        tpot_ms=None,
        finish_reason="error",
        error=error,
        schema_valid=False,
        text="",
    )
