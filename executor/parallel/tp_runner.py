"""The front's runner under tensor parallelism: the target's forward runs on N worker processes.

`TensorParallelRunner` takes `ModelRunner`'s place in the engine: the scheduler, the block manager, the
drafters, the grammar masks, sampling and verification stay in the front process, unchanged. Each
forward posts the step's sequences to every rank through shared memory (`step_channel.py`); the ranks
run their shards (`sharding.py`) over their own KV caches (same pages, their heads only), all-reducing
after ``o_proj`` and ``down_proj`` and gathering the logits through shared memory
(`shm_collectives.py`; off x86, whose store order they rely on, through gloo's, with a warning saying
why); rank 0 writes the logits (and any captured hidden states) back.

The ranks also join a gloo group (torch.distributed). A rank that exits, or a step no rank answers
within ``timeout_s``, fails the forward with an error naming the rank, and every worker is stopped.
Up to ``max_restarts`` times the ranks are then started again (`RanksRestarted`: their KV caches are
empty, so the engine fails the requests holding pages and drops its cached pages; later requests run);
after that the runner refuses every later forward with the message (the executor must be rebuilt).
`close()` stops and joins the workers; they also exit by themselves when the front process is gone.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import time
import weakref

import torch
import torch.multiprocessing as mp

from ..layers.cpu_kernels import cpu_kernels
from ..model.attention_paths import AttentionPaths
from ..model.forward_io import ForwardOutput, KVCacheLost, SequenceInput
from ..model.kv_cache import KVCacheSpec
from .gloo_collectives import GlooCollectives
from .sharding import check_shardable, rank_kv_spec, shard_model
from .shm_collectives import ShmCollectives, refusal_off_x86
from .step_channel import StepChannel
from .step_codec import HEADER, PER_SEQUENCE
from .worker import worker_main

logger = logging.getLogger("specexec")
POLL_S = 0.05  #: how often the front checks its workers while it waits for a step
FAILED_GRACE_S = 2.0  #: a rank failed and the others have not answered after this long: stop them all


class TensorParallelError(RuntimeError):
    """The tensor-parallel workers stopped; the message names the rank."""


class RanksRestarted(TensorParallelError, KVCacheLost):
    """A rank failed and every rank was started again: the forward failed, and the K/V every earlier
    forward wrote is gone."""


class TensorParallelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        kv_spec: KVCacheSpec,
        num_blocks: int,
        block_size: int,
        max_num_tokens: int,
        max_batch_size: int,
        world: int,
        timeout_s: float = 300.0,
        max_restarts: int = 0,
    ) -> None:
        check_shardable(model, world)
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ValueError(
                "tensor_parallel_size > 1 runs on CPU (gloo) only; NCCL on CUDA is not built yet"
            )
        self.model = model  #: the whole model, as the front's drafters and reports see it
        self.decoder = None  #: (the front runs no decoder)
        self.device = device
        self.world = world
        self.max_num_tokens = max_num_tokens
        self.capture_layers: tuple[int, ...] = ()
        self.graphs = None
        #: (the ranks measure nothing at start-up: each group's kernel is chosen as it runs)
        self.attention_paths = AttentionPaths()
        self.timeout_s = timeout_s
        self.failure: str | None = None
        self.max_restarts = max_restarts
        self.restarts = 0  #: times the ranks were started again after a fault
        self._restarting = False
        self._sizes = (kv_spec, num_blocks, block_size, max_num_tokens, max_batch_size)
        self._finalizer = None
        cpu_kernels()  # built (once per machine) here, not by every rank at once inside its first step
        self._start_workers("start-up")

    def _start_workers(self, what: str) -> None:
        """Spawn every rank with its shard and wait until each is ready (`_fail` on a fault)."""
        kv_spec, num_blocks, block_size, max_num_tokens, max_batch_size = self._sizes
        text_config = self.model.config.get_text_config()
        vocab, hidden = text_config.vocab_size, text_config.hidden_size
        max_pages = num_blocks + 1
        capacity = HEADER + max_batch_size * (PER_SEQUENCE + max_pages) + max_num_tokens
        ctx = mp.get_context("spawn")
        dtype = next(self.model.parameters()).dtype
        self.channel = StepChannel(ctx, self.world, capacity, max_num_tokens, vocab, hidden, dtype)
        per_rank_vocab = -(-vocab // self.world)
        self.comm = self._collectives(max_num_tokens * max(hidden, per_rank_vocab), dtype)
        threads = max(1, torch.get_num_threads() // self.world)
        self._procs = [
            self._start_rank(
                ctx,
                rank,
                self.model,
                (rank_kv_spec(kv_spec, self.world, rank), num_blocks, block_size, max_num_tokens),
                threads,
            )
            for rank in range(self.world)
        ]
        # an executor dropped without close(): its workers stop when it is collected
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _stop_workers, self._procs, self.channel, True)
        try:
            self._wait(what, self.timeout_s)
        finally:  # every rank has mapped the shared files (or failed): none is left behind on disk
            self.channel.unlink()
            if isinstance(self.comm, ShmCollectives):
                self.comm.unlink()
        if self.capture_layers:  # (a restart: the new ranks record what the old ones did)
            self.channel.post_capture(self.capture_layers)
            self._wait(what, self.timeout_s)
        logger.info("tensor parallelism: %d ranks, %d threads each", self.world, threads)

    def _collectives(self, capacity: int, dtype: torch.dtype) -> ShmCollectives | GlooCollectives:
        """Shared memory's on x86; gloo's (the ranks' default group) where the CPU may reorder stores."""
        refusal = refusal_off_x86()
        if refusal is None:
            return ShmCollectives(self.world, capacity, dtype, self.timeout_s)
        logger.warning("tensor parallelism: %s", refusal)
        return GlooCollectives(None, self.world, self.timeout_s)

    def _start_rank(self, ctx, rank: int, model, cache: tuple, threads: int):
        """Spawn rank ``rank`` with its shard (its tensors go through shared memory, not a copy)."""
        if rank == 0:
            self._init_method = f"tcp://127.0.0.1:{_free_port()}"
        shard = shard_model(model, rank, self.world, self.comm)
        args = (
            rank,
            self.world,
            self._init_method,
            shard,
            *cache,
            self.channel,
            self.comm,
            threads,
            self.timeout_s,
        )
        proc = ctx.Process(target=worker_main, args=args, daemon=True, name=f"specexec-tp{rank}")
        with _main_module_hidden():
            proc.start()
        return proc

    @classmethod
    def for_config(cls, model, kv_spec: KVCacheSpec, num_blocks: int, config) -> TensorParallelRunner:
        """The runner of an `ExecutorConfig` with ``tensor_parallel_size`` > 1."""
        return cls(
            model,
            kv_spec,
            num_blocks,
            config.block_size,
            config.max_num_tokens,
            config.max_batch_size,
            config.tensor_parallel_size,
            config.tensor_parallel_timeout_s,
            config.tensor_parallel_max_restarts,
        )

    # ---- the runner's interface ----------------------------------------------------------------------
    def capture(self, layers: tuple[int, ...]) -> None:
        """Record these hidden-state indices in every forward from now on (rank 0 sends them back)."""
        wanted = tuple(sorted(set(self.capture_layers) | set(layers)))
        if wanted == self.capture_layers:
            return
        if self.failure is not None:
            raise TensorParallelError(self.failure)
        self.channel.post_capture(wanted)
        self._wait("choosing the hidden states to capture", self.timeout_s)
        self.capture_layers = wanted

    def forward(self, seqs: list[SequenceInput]) -> ForwardOutput:
        if self.failure is not None:
            raise TensorParallelError(self.failure)
        cu_rows, cu_tokens = [0], [0]
        for s in seqs:
            cu_rows.append(cu_rows[-1] + s.num_logit_rows)
            cu_tokens.append(cu_tokens[-1] + len(s.token_ids))
        if cu_tokens[-1] > self.max_num_tokens:
            raise ValueError(f"batch of {cu_tokens[-1]} tokens exceeds max_num_tokens={self.max_num_tokens}")
        self.channel.post(seqs)
        self._wait("a forward", self.timeout_s)
        logits = self.channel.logits[: cu_rows[-1]].clone()  # [rows, vocab]
        hidden = {
            layer: self.channel.hidden[i, : cu_tokens[-1]].clone()  # [tokens, hidden]
            for i, layer in enumerate(self.capture_layers)
        }
        return ForwardOutput(logits, cu_rows, hidden, cu_tokens)

    def _wait(self, what: str, timeout_s: float) -> None:
        """Every rank's ``done``; a rank gone or a deadline passed stops them all."""
        deadline, remaining, flagged_at = time.monotonic() + timeout_s, self.world, None
        while remaining:
            if self.channel.done.acquire(timeout=POLL_S):
                remaining -= 1
                continue
            if flagged_at is None and int(self.channel.failed.sum()):
                flagged_at = time.monotonic()
            if flagged_at is not None and time.monotonic() - flagged_at > FAILED_GRACE_S:
                # a rank failed and another still waits for it in a collective: it would wait out
                # the collectives' timeout
                said = self.channel.take_errors()
                rank = min(said) if said else 0
                self._fail(f"tensor-parallel rank {rank} failed during {what}: {said.get(rank, '?')}")
            dead = [(rank, p.exitcode) for rank, p in enumerate(self._procs) if p.exitcode is not None]
            if dead:
                rank, code = dead[0]
                said = self.channel.take_errors()
                why = f": {said[rank]}" if rank in said else ""
                self._fail(f"tensor-parallel rank {rank} exited (exit code {code}) during {what}{why}")
            if time.monotonic() > deadline:
                self._fail(f"tensor-parallel ranks did not answer within {timeout_s:.0f} s during {what}")
        errors = self.channel.take_errors()
        if len(errors) == self.world:  # every rank refused the same inputs: they are still in step
            raise RuntimeError(f"tensor-parallel {what} failed: {errors[0]}")
        if errors:
            rank = min(errors)
            self._fail(f"tensor-parallel rank {rank} failed during {what}: {errors[rank]}")

    def _fail(self, message: str) -> None:
        """Stop every rank; start them again (empty KV caches: `RanksRestarted`) while restarts are
        left, else refuse this forward and every later one with ``message``."""
        self._stop(graceful=False)
        if self._restarting or self.restarts >= self.max_restarts:
            self.failure = message
            raise TensorParallelError(message)
        self._restarting = True
        try:
            self._start_workers("a restart")
        except Exception as exc:  # (a rank that failed again, or a process that did not start)
            self._stop(graceful=False)
            self.failure = f"{message}; starting the ranks again failed: {exc}"
            raise TensorParallelError(self.failure) from None
        finally:
            self._restarting = False
        self.restarts += 1
        logger.warning(
            "tensor parallelism: %s; ranks restarted (%d of %d)", message, self.restarts, self.max_restarts
        )
        raise RanksRestarted(f"{message}; the ranks were restarted ({self.restarts} of {self.max_restarts})")

    # ---- stopping ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop and join every worker (idempotent)."""
        self._stop(graceful=self.failure is None)

    def _stop(self, graceful: bool) -> None:
        _stop_workers(self._procs, self.channel, graceful)

    @property
    def broadcast_seconds(self) -> float:
        """Seconds the steps so far spent between the front's post and rank 0's read of them."""
        return float(self.channel.clock[1])

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs]


def _stop_workers(procs: list, channel: StepChannel, graceful: bool) -> None:
    """Ask the workers to stop (``graceful``) and join them; kill any still there after 5 s."""
    if graceful and any(p.is_alive() for p in procs):
        channel.post_stop()
        for p in procs:
            p.join(5)
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(5)


@contextlib.contextmanager
def _main_module_hidden():
    """Spawn runs the parent's ``__main__`` again in the child (its file or module) before the target,
    so a script without an ``if __name__ == "__main__"`` guard would build an executor in every worker.
    The workers need nothing from it: while they start, ``__main__`` names no file and no module."""
    main = sys.modules["__main__"]
    saved = {name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
