"""A torchrun job as tensor parallelism sees it: this process's rank from torchrun's environment, the
job's gloo group and its key-value store (`TorchrunEnv.join`), and the heartbeats that tell rank 0 which
rank is gone when the group breaks (gloo's own message names a peer's address, not its rank)."""

from __future__ import annotations

import datetime
import os
import threading
import time
from dataclasses import dataclass

import torch.distributed as dist

ENVIRONMENT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
NO_DEADLINE = datetime.timedelta(days=365)  #: the working group's own: a rank waits for the next request
BEAT_S = 0.5  #: how often a rank above 0 adds to its heartbeat counter


@dataclass(frozen=True, slots=True)
class TorchrunEnv:
    """This process's place in the job, from the environment torchrun sets."""

    rank: int
    world: int

    @classmethod
    def from_environ(cls, world: int) -> TorchrunEnv:
        """Raise ValueError without torchrun's environment, or where its size is not ``world``."""
        missing = [name for name in ENVIRONMENT if name not in os.environ]
        if missing:
            raise ValueError(
                f"tensor_parallel_launch torchrun needs torchrun's environment ({', '.join(missing)} not "
                "set): start every rank with torchrun, or use tensor_parallel_launch spawn on one machine"
            )
        env = cls(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        if env.world != world:
            raise ValueError(f"tensor_parallel_size is {world}, but torchrun started {env.world} ranks")
        return env

    def join(self, timeout_s: float):
        """Join the job (MASTER_ADDR:MASTER_PORT), waiting at most ``timeout_s`` for every rank; returns
        the gloo group the ranks then work in (no deadline of its own) and the job's store. Under
        torchrun the store is its agent's; started by hand, rank 0 hosts it."""
        startup = datetime.timedelta(seconds=timeout_s)
        hosted_by_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            self.world,
            is_master=self.rank == 0 and not hosted_by_agent,
            timeout=startup,
        )
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world, timeout=startup)
        group = dist.new_group(list(range(self.world)), timeout=NO_DEADLINE, backend="gloo")
        return group, dist.PrefixStore("specexec-heartbeat", store)


class Heartbeat:
    """(a rank above 0) adds 1 to its counter in the store every `BEAT_S`, from a daemon thread, until
    stopped or the store is gone."""

    def __init__(self, store, rank: int) -> None:
        self._store, self._key = store, f"rank{rank}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"specexec-heartbeat{rank}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                self._store.add(self._key, 1)
            except Exception:  # rank 0 (or torchrun's agent) is gone: nobody listens
                return

    def stop(self) -> None:
        self._stop.set()


def silent_ranks(store, world: int) -> list[int]:
    """(rank 0) the ranks above 0 whose heartbeat stood still for three beats: gone."""
    try:
        before = [store.add(f"rank{r}", 0) for r in range(1, world)]
        time.sleep(3 * BEAT_S)
        after = [store.add(f"rank{r}", 0) for r in range(1, world)]
    except Exception:
        return []
    return [r for r, (a, b) in enumerate(zip(before, after, strict=True), start=1) if a == b]
