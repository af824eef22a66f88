"""Background thread that builds one step's grammar bitmask while the target forward runs."""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import xgrammar as xgr

from .request_grammar import RequestGrammar, RowFill


@dataclass(frozen=True, slots=True)
class MaskJob:
    grammar: RequestGrammar  # owned by the worker from start() until wait() returns
    row0: int  # first verify row of this request
    draft_token_ids: tuple[int, ...]  # rows row0 .. row0+len(drafts) may be filled
    #: a token tree's parents (`sampling/tree_shape.py`): row row0 + 1 + i is node i's; None: a chain
    parents: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class MaskResult:
    bitmask: torch.Tensor  # int32 [num_rows, words]; a view of a reused buffer, valid until next start()
    needs_mask: torch.Tensor  # int32 [num_rows]; 1 = row holds a grammar mask, 0 = leave logits alone
    fills: list[RowFill | None]  # one per job, in job order (None: that job failed)
    errors: list[str | None]  # one per job: why its rows could not be built (its rows are left alone)
    build_ms: float  # worker time spent building (and, on CUDA, enqueuing the copy)
    wait_ms: float  # time wait() blocked: 0 when fully overlapped with the forward


def _check_fill(fill, num_drafts: int, is_tree: bool) -> None:
    if not (
        isinstance(fill, RowFill)
        and 0 <= fill.num_rows_filled <= num_drafts + 1
        and 0 <= fill.num_drafts_accepted_by_grammar <= num_drafts
        and (fill.tree_rows is not None) == is_tree
        and (not is_tree or all(0 <= row <= num_drafts for row in fill.tree_rows))
    ):
        raise ValueError(f"fill_rows returned {fill!r} for {num_drafts} drafts")


class MaskWorker:
    """Daemon thread; start(jobs) before the target forward, wait() after it.

    Unfilled rows in [0, num_rows) are all-allowed (-1) with needs_mask 0. On CUDA the host buffers
    are pinned and copied on a side stream; wait() makes the current stream wait for that copy.
    """

    def __init__(self, max_rows: int, vocab_size: int, device: str | torch.device = "cpu") -> None:
        self.max_rows = max_rows
        self.words = xgr.get_bitmask_shape(1, vocab_size)[1]
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        pin = torch.cuda.is_available()
        self._bitmask = torch.full((max_rows, self.words), -1, dtype=torch.int32, pin_memory=pin)
        self._needs_mask = torch.zeros(max_rows, dtype=torch.int32, pin_memory=pin)
        if self._cuda:
            self._dev_bitmask = torch.empty_like(self._bitmask, device=self.device)
            self._dev_needs_mask = torch.empty_like(self._needs_mask, device=self.device)
            self._stream = torch.cuda.Stream(self.device)
            self._copied = torch.cuda.Event()  # side stream finished the host->device copy
            self._consumer_free = torch.cuda.Event()  # main stream done with the previous device mask
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Event()
        self._busy = False
        self._num_rows = 0
        self._fills: list[RowFill | None] = []
        self._errors: list[str | None] = []
        self._error: BaseException | None = None
        self._build_ms = 0.0
        # The thread holds the worker weakly, so a worker nobody uses any more is collected and its
        # thread ends (close() ends it at once).
        self._thread = threading.Thread(
            target=MaskWorker._serve, args=(weakref.ref(self), self._queue), name="grammar-mask", daemon=True
        )
        self._thread.start()

    def start(self, jobs: Sequence[MaskJob], num_rows: int) -> None:
        """Queue one step's mask build for rows [0, num_rows)."""
        if self._busy:
            raise RuntimeError("MaskWorker.start called before wait() of the previous step")
        if not 0 <= num_rows <= self.max_rows:
            raise ValueError(f"num_rows {num_rows} outside [0, {self.max_rows}]")
        end = 0
        for job in sorted(jobs, key=lambda j: j.row0):
            if job.row0 < end or job.row0 + len(job.draft_token_ids) >= num_rows:
                raise ValueError(f"job rows starting at {job.row0} overlap or exceed num_rows {num_rows}")
            end = job.row0 + len(job.draft_token_ids) + 1
        if self._cuda:
            self._consumer_free.record(torch.cuda.current_stream(self.device))
        self._busy = True
        self._num_rows = num_rows
        self._done.clear()
        self._queue.put(list(jobs))

    def wait(self, timeout: float | None = None) -> MaskResult:
        """Block until the build is done; re-raises an exception from the worker."""
        if not self._busy:
            raise RuntimeError("MaskWorker.wait called without start")
        t0 = time.perf_counter()
        if not self._done.wait(timeout):
            raise TimeoutError(f"grammar mask not built within {timeout} s")
        wait_ms = (time.perf_counter() - t0) * 1e3
        self._busy = False
        error, self._error = self._error, None
        if error is not None:
            raise error
        n = self._num_rows
        bitmask, needs_mask = self._bitmask[:n], self._needs_mask[:n]
        if self._cuda:
            torch.cuda.current_stream(self.device).wait_event(self._copied)
            bitmask, needs_mask = self._dev_bitmask[:n], self._dev_needs_mask[:n]
        return MaskResult(bitmask, needs_mask, self._fills, self._errors, self._build_ms, wait_ms)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def __del__(self) -> None:
        self._queue.put(None)

    @staticmethod
    def _serve(ref: weakref.ref, jobs_queue: queue.SimpleQueue) -> None:
        while (jobs := jobs_queue.get()) is not None:
            worker = ref()
            if worker is None:
                return
            worker._run(jobs)
            del worker, jobs

    def _run(self, jobs: list[MaskJob]) -> None:
        t0 = time.perf_counter()
        try:
            self._fills, self._errors = self._build(jobs, self._num_rows)
        except BaseException as exc:  # re-raised on the main thread by wait()
            self._error = exc
        self._build_ms = (time.perf_counter() - t0) * 1e3
        self._done.set()

    def _build(self, jobs: list[MaskJob], n: int) -> tuple[list[RowFill | None], list[str | None]]:
        """Each job's rows; a job that fails (its grammar broke) leaves its rows all-allowed and unmasked
        and reports why, the other jobs go on."""
        if self._cuda:
            self._copied.synchronize()  # the previous async copy has finished reading the host buffers
        bitmask, needs_mask = self._bitmask[:n], self._needs_mask[:n]  # [n, words], [n]
        bitmask.fill_(-1)
        needs_mask.zero_()
        fills: list[RowFill | None] = []
        errors: list[str | None] = []
        for job in jobs:
            try:
                if job.parents is None:
                    fill = job.grammar.fill_rows(bitmask, job.row0, job.draft_token_ids)
                else:
                    fill = job.grammar.fill_tree_rows(bitmask, job.row0, job.draft_token_ids, job.parents)
                _check_fill(fill, len(job.draft_token_ids), job.parents is not None)
            except Exception as exc:
                bitmask[job.row0 : job.row0 + len(job.draft_token_ids) + 1] = -1
                fills.append(None)
                errors.append(f"grammar mask failed: {exc}")
                continue
            if fill.tree_rows is None:
                needs_mask[job.row0 : job.row0 + fill.num_rows_filled] = 1
            else:
                for row in fill.tree_rows:
                    needs_mask[job.row0 + row] = 1
            fills.append(fill)
            errors.append(None)
        if self._cuda:
            with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
                self._stream.wait_event(self._consumer_free)
                self._dev_bitmask[:n].copy_(bitmask, non_blocking=True)
                self._dev_needs_mask[:n].copy_(needs_mask, non_blocking=True)
                self._copied.record(self._stream)
        return fills, errors
