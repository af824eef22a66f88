"""Captured forwards in tests that run without a GPU.

- `CapturabilityCheck`: a capture backend for meta-device models that fails a captured forward which
  reads a value or takes host data (`NoHostData`);
- `replay_captured_forwards`: every model's decode/verify forward captured with the eager-replay
  backend, so that later steps run through the captured path;
- `graph_stats`: how the forwards of the target and of the drafter's model ran.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class NoHostData(TorchDispatchMode):
    """Fails an op that takes a host tensor (not a scalar): inside a captured graph its data would be
    the capture's forever (and the copy is not allowed while capturing)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for leaf in tree_leaves((args, kwargs)):
            if isinstance(leaf, torch.Tensor) and leaf.device.type == "cpu" and leaf.dim() > 0:
                raise AssertionError(f"{func} reads a host tensor of shape {tuple(leaf.shape)}")
        return func(*args, **kwargs)


class CapturabilityCheck:
    """A capture backend for meta-device models: runs each captured function once under `NoHostData`.
    On the meta device a read of any value (``item``, ``bool``, ``nonzero``) raises as well."""

    label = "checked forwards"

    def capture(self, fn):
        with NoHostData():
            fn()
        return fn

    def memory_in_use(self) -> int:
        return 0


def replay_captured_forwards(executor) -> None:
    """Capture every model's decode/verify forward with the eager-replay backend (CUDA graphs' fixed
    shapes, padding and buffers, launched eagerly): later steps run through the captured path."""
    from specexec.executor.model.cuda_graphs import EagerReplay

    reports = executor.capture_forwards(EagerReplay())
    assert reports and all(r.error is None and r.num_graphs > 0 for r in reports), reports


def graph_stats(executor) -> list:
    """How the forwards of the target and of the drafter's model ran."""
    drafter = executor.speculation.drafter
    inputs = getattr(drafter, "runner", None) or getattr(drafter, "inputs", None)
    return [g.stats for g in (executor.core.runner.graphs, getattr(inputs, "graphs", None)) if g is not None]
