"""The front's step broadcast to the tensor-parallel workers, and rank 0's answer, in shared memory.

One writer (the front), N readers (the ranks): each step's sequences are flattened into one int64
buffer (no pickling per step), then every rank's ``go`` semaphore is released. Rank 0 writes the
step's logits into a shared buffer; every rank then releases ``done`` once (an error message first,
into ``errors``, when its forward raised).

The payload is `step_codec.py`'s int64 layout.
"""

from __future__ import annotations

import queue
import time

import torch

from ..model.forward_io import SequenceInput
from .shared_buffer import SharedBuffer
from .step_codec import decode, encode_capture, encode_forward, encode_stop

MAX_CAPTURED = 8  #: hidden-state layers rank 0 can send back per forward (EAGLE-3 asks for 3)


class StepChannel:
    """Shared buffers and semaphores, made by the front and handed to each worker at spawn."""

    def __init__(
        self, ctx, world: int, capacity: int, logit_rows: int, vocab: int, hidden: int, dtype: torch.dtype
    ):
        self.world = world
        self.payload = torch.zeros(capacity, dtype=torch.long).share_memory_()  # [capacity]
        # [logit_rows, vocab]: rank 0's logits (sparse: pages are touched only as rows are written)
        self._logits = SharedBuffer((logit_rows, vocab), dtype)
        # [MAX_CAPTURED, tokens, hidden]: rank 0's captured hidden states (the residual stream is whole
        # on every rank after each layer's all-reduce), touched only when a drafter asks for them
        self._hidden = SharedBuffer((MAX_CAPTURED, logit_rows, hidden), dtype)
        self.go = [ctx.Semaphore(0) for _ in range(world)]
        self.done = ctx.Semaphore(0)
        self.errors = ctx.Queue()  #: (rank, message) of a forward that raised or a worker that failed
        #: [world]: 1 where a rank put a message in ``errors`` this step (set before its ``done``, so the
        #: front never takes a failed step for a good one while the message is still in the pipe)
        self.failed = torch.zeros(world, dtype=torch.long).share_memory_()
        #: [when the last step was posted, the broadcast's total seconds so far (post to rank 0's read,
        #: wake-up included; perf_counter is one clock across processes on Linux)]
        self.clock = torch.zeros(2, dtype=torch.float64).share_memory_()

    @property
    def logits(self) -> torch.Tensor:
        return self._logits.tensor()

    @property
    def hidden(self) -> torch.Tensor:
        return self._hidden.tensor()

    def map_buffers(self) -> None:
        """(a worker) map the shared buffers now, while their files exist."""
        self._logits.tensor()
        self._hidden.tensor()

    def unlink(self) -> None:
        """Remove the shared files (every process has mapped them once the workers have started)."""
        self._logits.unlink()
        self._hidden.unlink()

    # ---- front -------------------------------------------------------------------------------------
    def post(self, seqs: list[SequenceInput]) -> None:
        """Write one forward's sequences and wake every rank."""
        self.clock[0] = time.perf_counter()
        self._write(encode_forward(seqs))

    def post_stop(self) -> None:
        self._write(encode_stop())

    def post_capture(self, layers: tuple[int, ...]) -> None:
        """From now on every forward records these hidden-state indices (`ModelRunner.capture`)."""
        if len(layers) > MAX_CAPTURED:
            raise ValueError(f"at most {MAX_CAPTURED} hidden-state layers under tensor parallelism")
        self._write(encode_capture(layers))

    def _write(self, flat: torch.Tensor) -> None:
        """The step into the payload, then every rank woken."""
        if flat.numel() > self.payload.numel():
            raise ValueError(
                f"a step of {flat.numel()} ints exceeds the broadcast buffer ({self.payload.numel()})"
            )
        self.payload[: flat.numel()].copy_(flat)
        for go in self.go:
            go.release()

    def take_errors(self, wait_s: float = 2.0) -> dict[int, str]:
        """The messages of the ranks that failed since the last call, by rank."""
        flagged = int(self.failed.sum())
        self.failed.zero_()
        messages: dict[int, str] = {}
        for _ in range(flagged):
            try:
                rank, message = self.errors.get(timeout=wait_s)
            except queue.Empty:
                break
            messages.setdefault(rank, message)
        return messages

    # ---- ranks -------------------------------------------------------------------------------------
    def report_error(self, rank: int, message: str) -> None:
        """(a rank) this step failed: the message, then the flag; ``done`` comes after."""
        self.errors.put((rank, message))
        self.failed[rank] = 1

    def read(self) -> list[SequenceInput] | tuple[int, ...] | None:
        """The posted forward's sequences, or the hidden-state layers to capture (a tuple), or None: stop."""
        return decode(self.payload)

    def note_read(self) -> None:
        """(rank 0) the step's sequences are read: the broadcast is over."""
        self.clock[1] += time.perf_counter() - float(self.clock[0])
