"""transformers' own continuous batching with paged attention, driven like every other engine.

``generate_batch`` takes every prompt at once and queues those beyond its batch inside transformers, so
its timestamps count the time a request waited for a slot, while specexec's and a server's rows start
the clock when the bench sends a request into a free slot. Here the bench keeps ``concurrency``
requests in transformers' continuous-batching manager and sends the next when one finishes (the
loop `run_specexec` and the server client run), so TTFT starts at the same moment for every engine; and
the wall time runs from the first request sent to the last done, as theirs does (the manager's set-up
and stop, which ``generate_batch`` counted, are outside it like the executor's construction).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from ..records import RequestRecord, schema_valid
from ..workload.stop_tokens import num_stop_tokens
from .specexec_hf import Workload

NO_EOS = -1  #: transformers' "stop on nothing"
RESULT_WAIT_S = 1.0  #: how long one wait for a finished request lasts before the loop checks the manager


def hf_batch_generation_config(tokenizer, work: Workload):
    """Stop on the workload's stop set, or with ``ignore_eos`` suppress it (-inf at every step;
    ``min_new_tokens`` would not do: continuous batching drops that processor)."""
    from transformers import GenerationConfig

    stops = list(work.stop_token_ids)
    return GenerationConfig(
        max_new_tokens=work.max_tokens,
        do_sample=work.temperature > 0,
        temperature=work.temperature if work.temperature > 0 else None,
        eos_token_id=NO_EOS if work.ignore_eos or not stops else stops,
        suppress_tokens=stops if work.ignore_eos and stops else None,
        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
    )


def run_hf_generate_batch(
    model, tokenizer, work: Workload, concurrency: int, on_done: Callable[[], None] = lambda: None
) -> tuple[list[RequestRecord], float]:
    """At most ``concurrency`` requests in transformers' batch, the next sent as one finishes; records
    in prompt order."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    hints = WorkloadHints(
        max_prompt_length=max(len(ids) for ids in work.token_ids),
        max_generated_length=work.max_tokens,
        num_requests=len(work.token_ids),
    )
    pending = deque(range(len(work.prompts)))
    in_flight: dict[str, int] = {}
    outputs: dict[int, object] = {}
    # (no inference_mode here: the manager runs its loop on a thread of its own)
    with model.continuous_batching_context_manager(
        generation_config=hf_batch_generation_config(tokenizer, work),
        continuous_batching_config=ContinuousBatchingConfig(
            max_requests_per_batch=concurrency, num_blocks=_pages_needed(work, concurrency)
        ),
        block=True,
        timeout=5,
        workload_hints=hints,
    ) as manager:
        _warm_up(manager, work.token_ids[0][:1])
        start = time.perf_counter()  # the wall time, like every engine's: first sent to last done
        while pending or in_flight:
            while pending and len(in_flight) < concurrency:
                i = pending.popleft()
                request_id = f"bench-{i}"
                # the request's created_time, TTFT's start, is stamped here: when it is sent
                manager.add_request(
                    work.token_ids[i], request_id, max_new_tokens=work.max_tokens, record_timestamps=True
                )
                in_flight[request_id] = i
            result = manager.get_result(timeout=RESULT_WAIT_S)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("transformers' continuous batching loop stopped")
                continue
            if result.is_finished() and result.request_id in in_flight:
                outputs[in_flight.pop(result.request_id)] = result
                on_done()
        wall = time.perf_counter() - start  # (not the manager's set-up and stop)
    return [_record(tokenizer, work, i, outputs[i]) for i in range(len(work.prompts))], wall


def _pages_needed(work: Workload, concurrency: int) -> int:
    """Pages for ``concurrency`` requests of the workload's longest prompt and output (and the warm-up's
    one), as many as the run can hold at once: left to itself transformers sizes its paged cache by the
    free memory, and allocating that (gigabytes on a 24 GiB machine) took 28 s before the first step."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    page = ContinuousBatchingConfig().page_size
    longest = max(len(ids) for ids in work.token_ids) + work.max_tokens
    return (concurrency + 1) * -(-longest // page) + 1


def _warm_up(manager, token_ids: list[int]) -> None:
    """One untimed token through a new manager: its first step sets up its cache (1.5 s for the tiny
    test model on 2 cores), which the first timed requests' TTFT would otherwise carry, as the executor's
    set-up is paid before its timed run. A one-token prompt fills no cache block, so no timed prompt can
    reuse it."""
    manager.add_request(token_ids, "warm-up", max_new_tokens=1)
    while True:
        result = manager.get_result(timeout=RESULT_WAIT_S)
        if result is not None and result.is_finished():
            return
        if result is None and not manager.is_running():
            raise RuntimeError("transformers' continuous batching loop stopped")


def _record(tokenizer, work: Workload, i: int, out) -> RequestRecord:
    tokens = list(out.generated_tokens)
    stamps = out.timestamps or []
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    stops = set(work.stop_token_ids)
    return RequestRecord(
        id=work.prompts[i].id,
        num_prompt_tokens=len(work.token_ids[i]),
        num_output_tokens=len(tokens),
        latency_ms=((stamps[-1] if stamps else time.perf_counter()) - out.created_time) * 1000,
        ttft_ms=(stamps[0] - out.created_time) * 1000 if stamps else None,
        tpot_ms=(stamps[-1] - stamps[0]) * 1000 / (len(stamps) - 1) if len(stamps) > 1 else None,
        finish_reason="stop" if not work.ignore_eos and tokens and tokens[-1] in stops else "length",
        error=out.error,
        schema_valid=schema_valid(text, work.prompts[i].schema),
        text=text,
        num_stop_tokens=num_stop_tokens(tokens, work.stop_token_ids),
    )
