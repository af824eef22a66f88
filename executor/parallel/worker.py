"""A tensor-parallel worker: joins the process group, holds its shard and its KV cache, and runs one
forward per posted step, in a tight loop, until told to stop or its parent is gone (noticed within
``PARENT_CHECK_S`` between steps, within milliseconds in a shared-memory collective: `FrontGone`).
The ranks look at ``os.getppid()`` rather than ask for ``PR_SET_PDEATHSIG``: that signal comes when the
*thread* that started the rank ends, and a restart may start them from an engine thread."""

from __future__ import annotations

import datetime
import os
import traceback

import torch
import torch.distributed as dist

from ..model.kv_cache import KVCache, KVCacheSpec
from ..model.model_runner import ModelRunner
from .gloo_collectives import GlooCollectives
from .shm_collectives import FrontGone, ShmCollectives
from .step_channel import StepChannel

PARENT_CHECK_S = 1.0  #: how often a waiting worker checks that the front is still there


def worker_main(
    rank: int,
    world: int,
    init_method: str,
    shard: torch.nn.Module,
    kv_spec: KVCacheSpec,
    num_blocks: int,
    block_size: int,
    max_num_tokens: int,
    channel: StepChannel,
    comm: ShmCollectives | GlooCollectives,
    threads: int,
    timeout_s: float,
) -> None:
    parent = os.getppid()
    try:
        torch.set_num_threads(threads)
        dist.init_process_group(
            "gloo",
            init_method=init_method,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        runner = ModelRunner(
            shard, KVCache(kv_spec, num_blocks, block_size, torch.device("cpu")), max_num_tokens
        )
        if isinstance(comm, ShmCollectives):  # (gloo's run in the group just joined)
            comm.join(rank)
        channel.map_buffers()  # (the front unlinks the shared files once every rank has started)
    except Exception:
        channel.report_error(rank, "start-up failed: " + traceback.format_exc(limit=3))
        channel.done.release()
        return
    channel.done.release()  # ready
    go = channel.go[rank]
    while True:
        if not go.acquire(timeout=PARENT_CHECK_S):
            if os.getppid() != parent:  # the front died: nothing will come
                break
            continue
        seqs = channel.read()
        if seqs is None:
            break
        try:
            if isinstance(seqs, tuple):
                runner.capture(seqs)
            else:
                if rank == 0:
                    channel.note_read()
                _forward(runner, seqs, channel, rank)
        except FrontGone:
            break
        except Exception as exc:
            channel.report_error(rank, f"{type(exc).__name__}: {exc}")
        channel.done.release()
    dist.destroy_process_group()


def _forward(runner: ModelRunner, seqs, channel: StepChannel, rank: int) -> None:
    out = runner.forward(seqs)
    if rank != 0:
        return
    channel.logits[: out.logits.shape[0]].copy_(out.logits)  # [rows, vocab]
    for i, layer in enumerate(runner.capture_layers):
        hidden = out.hidden_states[layer]  # [tokens, hidden]
        channel.hidden[i, : hidden.shape[0]].copy_(hidden)
