"""A tensor-parallel rank other than 0 when torchrun starts the ranks (``tensor_parallel_launch:
torchrun``), on this host or another: it joins rank 0's group, loads its shard itself from the config's
model (in the dtype rank 0 loaded, quantized and converted as rank 0's: from a safetensors directory
layer by layer, never the whole model (`parallel/rank_loading.py`); a GGUF whole, then sliced), holds it
and its KV cache (as many pages as rank 0's), and runs every step rank 0 broadcasts until rank 0 stops
it or is gone (`parallel/torchrun_runner.py`).

`specexec run` and `specexec serve` call `run_worker` on every rank but 0, so one torchrun command line
starts them all; a Python program calls it there itself.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from .auto_defaults import resolve_auto_defaults
from .config import ExecutorConfig
from .engine_setup import load_target
from .kernel_plan.plan import route_quantized_layers
from .model.kv_cache import KVCache, KVCacheSpec
from .model.model_runner import ModelRunner
from .parallel.gloo_collectives import GlooCollectives, broadcast_step
from .parallel.rank_loading import load_shard
from .parallel.sharding import check_shardable, rank_kv_spec, shard_model
from .parallel.step_codec import decode
from .parallel.torchrun_env import Heartbeat, TorchrunEnv
from .parallel.torchrun_runner import DTYPES

logger = logging.getLogger("specexec")


def is_worker_rank(config: ExecutorConfig) -> bool:
    """Whether this process is a torchrun rank other than 0 of a ``tensor_parallel_launch: torchrun``
    config (the environment checked as `run_worker` checks it)."""
    if config.tensor_parallel_launch != "torchrun" or config.tensor_parallel_size < 2:
        return False
    return TorchrunEnv.from_environ(config.tensor_parallel_size).rank != 0


def run_worker(config: ExecutorConfig) -> None:
    """Serve as this torchrun rank (not 0) until rank 0 stops; raises RuntimeError when rank 0 is gone
    without stopping it (its connection closed) and ValueError for a config it cannot run."""
    if config.tensor_parallel_launch != "torchrun":
        raise ValueError("run_worker is for tensor_parallel_launch torchrun")
    world = config.tensor_parallel_size
    env = TorchrunEnv.from_environ(world)
    if env.rank == 0:
        raise ValueError("torchrun's rank 0 runs the Executor, not run_worker")
    config, _ = resolve_auto_defaults(None, config, False)  # the same quantization rank 0 resolves
    timeout_s = config.tensor_parallel_timeout_s
    group, store = env.join(timeout_s)
    heartbeat = Heartbeat(store, env.rank)  # (rank 0 names this rank by it if this process dies)
    try:
        # rank 0 has loaded when it sends this: as long as that takes
        num_blocks, max_num_tokens, dtype_index = broadcast_step(None, group, None).tolist()
        dtype = DTYPES[dtype_index]
        comm = GlooCollectives(group, world, timeout_s)
        shard = (
            None
            if config.model is None
            else load_shard(config.model, dtype, config.quantization, env.rank, world, comm)
        )
        if shard is None:  # (a GGUF): the whole model, then this rank's slices of it
            model, *_ = load_target(None, None, config, str(dtype).removeprefix("torch."))
            check_shardable(model, world)
            route_quantized_layers(config, model)
            shard = shard_model(model, env.rank, world, comm)
            del model
        else:
            logger.info("tensor parallelism: rank %d read its shard layer by layer", env.rank)
            route_quantized_layers(config, shard)
        kv_spec = rank_kv_spec(KVCacheSpec.from_model_config(shard.config, dtype), world, env.rank)
        cache = KVCache(kv_spec, num_blocks, config.block_size, torch.device("cpu"))
        runner = ModelRunner(shard, cache, max_num_tokens)
        dist.barrier(group, async_op=True).wait()  # ready
        logger.info("tensor parallelism: rank %d of %d ready (torchrun, gloo)", env.rank, world)
        while (step := decode(broadcast_step(None, group, None))) is not None:
            if isinstance(step, tuple):
                runner.capture(step)
            else:
                runner.forward(step)
    finally:
        heartbeat.stop()
        dist.destroy_process_group()
