"""Multi-turn conversations through a server (``--server``, ``--baseline llama-server``), as
``conversations.py`` runs them through specexec: each turn's prompt is the whole conversation so far, the
server's own earlier answers included, rendered here with the model's chat template into the token ids
a ``/v1/completions`` request carries (as every server row sends its prompts), so a later turn's prompt
starts with the one before it, which a server's prefix cache may reuse.

``concurrency`` conversations are in flight at once; a conversation sends its next turn when the server
has answered the last one, and ends early when a turn fails.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

from ..records import RequestRecord
from .server import Outgoing, ServerTarget, client_for, request_record, server_base, spec_counters
from .specexec_hf import Workload

#: a turn's seed: the conversation's index times this, plus the turn (as conversations.py seeds them)
SEED_STRIDE = 1000


def run_server_conversations(
    target: ServerTarget,
    work: Workload,
    concurrency: int,
    render: Callable[[list[dict]], list[int]],
    decode: Callable[[list[int]], str] | None = None,
    on_done: Callable[[], None] = lambda: None,
    stop_texts: frozenset[str] = frozenset(),
) -> tuple[list[RequestRecord], float, dict]:
    """Every turn of every conversation, records in conversation then turn order (ids
    ``<id>/turn<t>``), the wall time and the server's speculation counters over the run. ``render``:
    messages -> the chat template's token ids, ready for generation; ``decode``: ids -> the text sent
    instead, for a target that takes text; ``stop_texts`` as ``run_server`` takes them."""
    import httpx

    base, headers = server_base(target), target.headers()
    before = spec_counters(httpx, base)
    start = time.perf_counter()
    records = asyncio.run(
        _run(httpx, base, headers, target, work, concurrency, render, decode, on_done, stop_texts)
    )
    wall = time.perf_counter() - start
    after = spec_counters(httpx, base)
    return records, wall, {k: after.get(k, 0) - before.get(k, 0) for k in after}


async def _run(httpx, base, headers, target, work, concurrency, render, decode, on_done, stop_texts):
    limit = asyncio.Semaphore(concurrency)
    async with client_for(httpx, base, headers, target) as client:

        async def conversation(i: int) -> list[RequestRecord]:
            prompt, history, turns = work.prompts[i], list(work.prompts[i].messages), []
            async with limit:
                for turn in range(1, len(prompt.follow_ups) + 2):
                    ids = render(history)
                    outgoing = Outgoing(prompt, ids, i * SEED_STRIDE + turn, decode(ids) if decode else None)
                    record = await request_record(client, work, outgoing, stop_texts, target)
                    turns.append(replace(record, id=f"{prompt.id}/turn{turn}", turn=turn))
                    on_done()
                    if record.error is not None or turn > len(prompt.follow_ups):
                        break
                    history += [
                        {"role": "assistant", "content": record.text},
                        {"role": "user", "content": prompt.follow_ups[turn - 1]},
                    ]
            return turns

        done = await asyncio.gather(*(conversation(i) for i in range(len(work.prompts))))
    return [record for turns in done for record in turns]
