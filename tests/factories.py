"""What many test folders build or check the same way: one copy of each, imported from here.

- `assert_all_pages_free`: the page-accounting invariant after every request ended (target and draft
  caches, reference counts equal to their holders, nothing left in the scheduler).
- `tiny_config`: the executor settings the float64 tiny-model tests start from.
- `free_port`: a loopback port no one listens on, for tests that start servers or ranks.
"""

from __future__ import annotations

import socket

from specexec import ExecutorConfig
from specexec.executor.executor import Executor

#: what the float64 tiny-model tests run with unless a test says otherwise
TINY_SETTINGS = dict(
    num_kv_blocks=128, block_size=4, max_num_tokens=128, max_batch_size=8, dtype="float64", device="cpu"
)


def tiny_config(**overrides) -> ExecutorConfig:
    """An ExecutorConfig for a tiny random model: TINY_SETTINGS with ``overrides`` on top."""
    return ExecutorConfig(**{**TINY_SETTINGS, **overrides})


def assert_all_pages_free(executor: Executor) -> None:
    """Every KV page back in the free pool (cached pages no one holds count as free), for the target and
    for a draft model's own cache."""
    bm = executor.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "target pages leaked"
    assert not bm.block_tables and not bm.num_slots
    bm.check_references()
    assert not executor.core.scheduler.has_unfinished()
    draft_bm = getattr(executor.speculation.drafter, "block_manager", None)
    if draft_bm is not None:
        assert draft_bm.num_free_blocks == draft_bm.num_blocks, "draft model pages leaked"
        assert not draft_bm.block_tables and not draft_bm.num_slots


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
