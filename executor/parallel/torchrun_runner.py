"""The front's runner when torchrun starts the ranks (``tensor_parallel_launch: torchrun``), on this host
or on others: the front is rank 0 and runs rank 0's shard itself; ranks 1..N-1 are the processes
torchrun started beside it (`executor/torchrun_worker.py`), each loading the model from the config's
path and holding its own shard.

Everything goes through torch.distributed's gloo group (TCP): each step, rank 0 broadcasts the step's
int64 payload (`step_codec.py`: its length, then the ints), then every rank runs its shard with the
all-reduces and the logits' gather in gloo (`gloo_collectives.py`); rank 0 ends with the whole logits,
so nothing comes back. The group is made without a deadline of its own (a rank waits for the next
request as long as the front is there); each of the front's operations waits at most
``tensor_parallel_timeout_s``. A rank that exits closes its connections, which the front sees at once.

A failed or late step fails the forward, leaves the group (so the other ranks exit) and refuses every
later forward with the cause, naming the ranks whose heartbeat stopped (`torchrun_env.py`: gloo's own
message names only a peer's address).
"""

from __future__ import annotations

import datetime
import logging
import time

import torch
import torch.distributed as dist

from ..model.attention_paths import AttentionPaths
from ..model.forward_io import ForwardOutput, SequenceInput
from ..model.kv_cache import KVCache, KVCacheSpec
from ..model.model_runner import ModelRunner
from .gloo_collectives import GlooCollectives, broadcast_step
from .sharding import check_shardable, rank_kv_spec, shard_model
from .step_codec import encode_capture, encode_forward, encode_stop
from .torchrun_env import TorchrunEnv, silent_ranks
from .tp_runner import TensorParallelError

logger = logging.getLogger("specexec")
#: what the front tells the ranks at start-up: [KV pages, max_num_tokens, dtype (an index here)]
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


class TorchrunRunner:
    """`ModelRunner`'s interface for the engine; rank 0 of a torchrun job (see the module doc)."""

    def __init__(self, model: torch.nn.Module, kv_spec: KVCacheSpec, num_blocks: int, config) -> None:
        world = config.tensor_parallel_size
        check_shardable(model, world)
        env = TorchrunEnv.from_environ(world)  # (rank 0: `launch.refuse_unbuilt_options`)
        self.model = model  #: the whole model, as the front's drafters and reports see it
        self.decoder = None
        self.device = next(model.parameters()).device
        self.world = world
        self.max_num_tokens = config.max_num_tokens
        self.capture_layers: tuple[int, ...] = ()
        self.graphs = None
        self.attention_paths = AttentionPaths()
        self.failure: str | None = None
        self.broadcast_seconds = 0.0  #: the steps' broadcasts so far (rank 0's side)
        self.timeout = datetime.timedelta(seconds=config.tensor_parallel_timeout_s)
        dtype = next(model.parameters()).dtype
        if dtype not in DTYPES:
            raise ValueError(
                f"tensor_parallel_launch torchrun runs {', '.join(map(str, DTYPES))}; got {dtype}"
            )
        self._in_group, self._store = True, None
        try:
            self.group, self._store = env.join(config.tensor_parallel_timeout_s)
        except Exception as exc:  # a rank never came (or MASTER_ADDR is wrong): nothing half-joined stays
            self._in_group = dist.is_initialized()
            self._fail("joining the job", exc)
        try:
            # the ranks load in the front's dtype and size their caches as the front did
            sizes = torch.tensor([num_blocks, config.max_num_tokens, DTYPES.index(dtype)])
            broadcast_step(sizes, self.group, self.timeout)
            comm = GlooCollectives(self.group, world, config.tensor_parallel_timeout_s)
            cache = KVCache(rank_kv_spec(kv_spec, world, 0), num_blocks, config.block_size, self.device)
            self._runner = ModelRunner(shard_model(model, 0, world, comm), cache, config.max_num_tokens)
            dist.barrier(self.group, async_op=True).wait(self.timeout)  # every rank holds its shard
        except Exception as exc:
            self._fail("start-up", exc)
        logger.info("tensor parallelism: rank 0 of %d (torchrun, gloo)", world)

    def capture(self, layers: tuple[int, ...]) -> None:
        wanted = tuple(sorted(set(self.capture_layers) | set(layers)))
        if wanted == self.capture_layers:
            return
        self._check()
        self._guarded(
            "choosing the hidden states to capture",
            lambda: broadcast_step(encode_capture(wanted), self.group, self.timeout),
        )
        self._runner.capture(wanted)
        self.capture_layers = wanted

    def forward(self, seqs: list[SequenceInput]) -> ForwardOutput:
        self._check()
        num_tokens = sum(len(s.token_ids) for s in seqs)
        if num_tokens > self.max_num_tokens:
            raise ValueError(f"batch of {num_tokens} tokens exceeds max_num_tokens={self.max_num_tokens}")
        start = time.perf_counter()
        self._guarded("a forward", lambda: broadcast_step(encode_forward(seqs), self.group, self.timeout))
        self.broadcast_seconds += time.perf_counter() - start
        return self._guarded("a forward", lambda: self._runner.forward(seqs))

    def close(self) -> None:
        """Tell the ranks to stop, and leave the group (idempotent)."""
        if not self._in_group:
            return
        if self.failure is None:
            try:
                broadcast_step(encode_stop(), self.group, self.timeout)
            except RuntimeError:
                logger.warning("tensor parallelism: the ranks did not take the stop")
        self._leave()

    def worker_pids(self) -> list[int]:
        return []  # torchrun's processes, not this one's

    def _check(self) -> None:
        if self.failure is not None:
            raise TensorParallelError(self.failure)

    def _guarded(self, what: str, call):
        try:
            return call()
        except Exception as exc:  # the group is out of step: nothing after this can be trusted
            self._fail(what, exc)

    def _fail(self, what: str, exc: Exception) -> None:
        """Name the ranks whose heartbeat stopped, leave the group (the others' connections close, so
        they exit), refuse this forward and every later one."""
        gone = silent_ranks(self._store, self.world) if self._store is not None else []
        if gone:
            who = f"tensor-parallel rank {', '.join(map(str, gone))} stopped (no heartbeat)"
        else:
            who = "a tensor-parallel rank failed or did not answer in time (every rank's heartbeat goes on)"
        self.failure = f"{who} during {what} (torchrun, gloo: {exc})"
        self._leave()
        raise TensorParallelError(self.failure)

    def _leave(self) -> None:
        if self._in_group:
            self._in_group = False
            dist.destroy_process_group()
