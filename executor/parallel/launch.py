"""How the ranks start (``tensor_parallel_launch``): ``spawn``, the executor's own worker processes on
this machine (`tp_runner.py`), or ``torchrun``, the processes torchrun started, on this host or others
(`torchrun_runner.py`); and what neither runs yet, refused before anything loads."""

from __future__ import annotations

import torch

from ..model.kv_cache import KVCacheSpec
from .torchrun_env import TorchrunEnv
from .torchrun_runner import TorchrunRunner
from .tp_runner import TensorParallelRunner

LAUNCHES = ("spawn", "torchrun")


def refuse_unbuilt_options(model, config) -> None:
    """ValueError, before loading, for what tensor parallelism does not run: CUDA (NCCL is not built);
    under torchrun a module passed in (every rank loads the model from its path), a missing torchrun
    environment, or a rank other than 0 building an executor."""
    size = config.tensor_parallel_size
    if config.device not in ("auto", "cpu") or (config.device == "auto" and torch.cuda.is_available()):
        raise ValueError(
            f"tensor_parallel_size {size} runs on CPU (gloo) only; set device: cpu (NCCL is not built yet)"
        )
    if config.tensor_parallel_launch != "torchrun":
        return
    if isinstance(model, torch.nn.Module):
        raise ValueError(
            "tensor_parallel_launch torchrun: every rank loads the model from its path; pass the path "
            "(or None for the default model), not a module"
        )
    rank = TorchrunEnv.from_environ(size).rank
    if rank != 0:
        raise ValueError(
            f"this process is torchrun's rank {rank}: rank 0 runs the Executor, every other rank runs "
            "specexec.executor.torchrun_worker.run_worker(config) (specexec run and serve do)"
        )


def start_ranks(model, kv_spec: KVCacheSpec, num_blocks: int, config):
    """The runner that takes `ModelRunner`'s place for ``tensor_parallel_size`` > 1."""
    if config.tensor_parallel_launch == "torchrun":
        return TorchrunRunner(model, kv_spec, num_blocks, config)
    return TensorParallelRunner.for_config(model, kv_spec, num_blocks, config)
