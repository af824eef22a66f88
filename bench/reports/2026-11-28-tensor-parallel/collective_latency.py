"""One all-reduce of a hidden vector (576 floats, SmolLM2's hidden size) among 2 and 3 processes of one
thread each: torch.distributed's gloo group against specexec's shared-memory collectives.

    python bench/reports/2026-11-28-tensor-parallel/collective_latency.py
"""

from __future__ import annotations

import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from specexec.executor.parallel.shm_collectives import ShmCollectives

HIDDEN = 576
REPEATS = 300


def timed(all_reduce, rank: int, world: int, name: str) -> None:
    x = torch.full((1, HIDDEN), float(rank))
    for _ in range(20):
        all_reduce(x)
    start = time.perf_counter()
    for _ in range(REPEATS):
        all_reduce(x)
    if rank == 0:
        print(f"{world} ranks, {name}: {1e6 * (time.perf_counter() - start) / REPEATS:.0f} us", flush=True)


def gloo_rank(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    timed(dist.all_reduce, rank, world, "gloo")
    dist.destroy_process_group()


def shm_rank(rank: int, world: int, comm: ShmCollectives) -> None:
    torch.set_num_threads(1)
    comm.join(rank)
    timed(comm.all_reduce, rank, world, "shared memory")


def main() -> None:
    for world in (2, 3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(gloo_rank, args=(world, port), nprocs=world)
        comm = ShmCollectives(world, HIDDEN, torch.float32, timeout_s=60)
        mp.spawn(shm_rank, args=(world, comm), nprocs=world)
        comm.unlink()


if __name__ == "__main__":
    main()
