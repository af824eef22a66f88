"""Multi-turn conversations through specexec: each turn's prompt is the whole conversation so far, the
model's own earlier answers included, so a later turn's prompt starts with the one before it (what
prefix caching reuses).

``concurrency`` conversations are in flight at once; a conversation sends its next turn when the model
has answered the last one, and ends early when a turn fails.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from ...executor.engine.request import FinishReason, Request
from ...executor.executor import Executor
from ...prompt_sets.datasets import BenchPrompt
from ..records import RequestRecord
from .specexec_hf import Workload, record_of


def run_conversations(
    executor: Executor, work: Workload, concurrency: int, on_done: Callable[[], None] = lambda: None
) -> tuple[list[RequestRecord], float]:
    """Every turn of every conversation; records in conversation then turn order, ids ``<id>/turn<t>``."""
    pending = deque(range(len(work.prompts)))
    histories: dict[int, list[dict]] = {}
    in_flight: dict[str, tuple[int, int]] = {}  #: request id -> (conversation, turn from 1)
    records: dict[tuple[int, int], RequestRecord] = {}

    def send(i: int, turn: int) -> None:
        params = replace(work.sampling_params(i), seed=i * 1000 + turn)  # the same in every run
        state = executor.add_request(Request(list(histories[i]), params, f"bench-{i}-turn{turn}"))
        in_flight[state.request_id] = (i, turn)

    start = time.perf_counter()
    while pending or in_flight:
        while pending and len(in_flight) < concurrency:
            i = pending.popleft()
            histories[i] = list(work.prompts[i].messages)
            send(i, 1)
        for event in executor.step():
            if not (event.finished and event.output is not None and event.request_id in in_flight):
                continue
            i, turn = in_flight.pop(event.request_id)
            prompt, out = work.prompts[i], event.output
            record = record_of(prompt, out, stop_token_ids=work.stop_token_ids)
            record.id, record.turn = f"{prompt.id}/turn{turn}", turn
            records[(i, turn)] = record
            on_done()
            if turn <= len(prompt.follow_ups) and out.finish_reason is not FinishReason.ERROR:
                histories[i] += [
                    {"role": "assistant", "content": out.text},
                    {"role": "user", "content": prompt.follow_ups[turn - 1]},
                ]
                send(i, turn + 1)
    return [records[key] for key in sorted(records)], time.perf_counter() - start


def num_turns(prompts: list[BenchPrompt]) -> int:
    """Requests these conversations send at most (for the progress bar)."""
    return sum(1 + len(p.follow_ups) for p in prompts)
