"""A forward over scratch pages, for timing a model (the draft-length cost model, benchmarks) and for
warming it up at start-up: the pages are taken from the model's pool and freed at once, and nothing a
request holds is touched."""

from __future__ import annotations

import torch

from ..model.forward_io import SequenceInput
from ..model.model_runner import ModelRunner
from .block_manager import BlockManager

SCRATCH_REQUEST_ID = "__scratch_forward__"  #: the pages' owner while the forward runs


def scratch_forward(
    runner: ModelRunner, block_manager: BlockManager, num_tokens: int, context_len: int = 128
) -> None:
    """One forward over ``num_tokens`` new tokens after ``context_len`` cached ones (the context is cut
    to what the pool holds). On CUDA it waits for the forward, so a timer around it times the work."""
    context_len = max(0, min(context_len, block_manager.capacity_tokens - num_tokens))
    _forward_on_scratch_pages(runner, block_manager, [num_tokens], context_len)


def scratch_decode(
    runner: ModelRunner, block_manager: BlockManager, num_sequences: int, context_len: int = 128
) -> None:
    """One decode step of ``num_sequences`` sequences (one new token each after ``context_len`` cached
    ones, cut to the whole pages the free pool holds for each), as a batch of decoding requests runs."""
    pages_each = block_manager.num_free_blocks // num_sequences
    context_len = max(0, min(context_len, pages_each * block_manager.block_size - 1))
    _forward_on_scratch_pages(runner, block_manager, [1] * num_sequences, context_len)


def _forward_on_scratch_pages(
    runner: ModelRunner, block_manager: BlockManager, new_tokens: list[int], context_len: int
) -> None:
    """One forward of a sequence per entry of ``new_tokens`` (that many new tokens after ``context_len``
    cached ones), on pages taken for it and freed at once; on CUDA, waited for."""
    owners = [SCRATCH_REQUEST_ID + (str(i) if i else "") for i in range(len(new_tokens))]
    try:
        for owner, num_tokens in zip(owners, new_tokens):
            block_manager.allocate(owner, context_len + num_tokens)
        runner.forward(
            [
                SequenceInput([0] * n, context_len, block_manager.block_tables[owner], n)
                for owner, n in zip(owners, new_tokens)
            ]
        )
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)
    finally:
        for owner in owners:
            if owner in block_manager.block_tables:
                block_manager.free(owner)
