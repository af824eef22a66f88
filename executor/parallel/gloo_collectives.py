"""The sharded layers' all-reduce and all-gather through torch.distributed (gloo: TCP, so ranks on other
hosts can take part), each waited for at most ``timeout_s``: the group itself is made with no deadline
of its own, so a rank idle between requests does not time out (`torchrun_runner.py`)."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist


class GlooCollectives:
    """`shm_collectives.ShmCollectives`' interface over a gloo process group."""

    def __init__(self, group, world: int, timeout_s: float) -> None:
        self.group = group
        self.world = world
        self.timeout = datetime.timedelta(seconds=timeout_s)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks of ``x`` (contiguous, any shape), in place; every rank gets the same bits."""
        dist.all_reduce(x, group=self.group, async_op=True).wait(self.timeout)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """``x [R, C]`` of every rank side by side: ``[R, world * C]``."""
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous(), group=self.group, async_op=True).wait(self.timeout)
        return torch.cat(parts, dim=1)


def broadcast_step(payload: torch.Tensor | None, group, timeout: datetime.timedelta | None) -> torch.Tensor:
    """Rank 0 sends ``payload`` (int64, any length) to every rank; the others pass None and get it.
    Two broadcasts: its length, then the ints. ``timeout``: None waits as long as it takes (a rank
    waiting for the next request)."""
    size = torch.tensor([0 if payload is None else payload.numel()])
    _wait(dist.broadcast(size, 0, group=group, async_op=True), timeout)
    if payload is None:
        payload = torch.empty(int(size), dtype=torch.long)
    _wait(dist.broadcast(payload, 0, group=group, async_op=True), timeout)
    return payload


def _wait(work, timeout: datetime.timedelta | None) -> None:
    if timeout is None:
        work.wait()
    else:
        work.wait(timeout)
