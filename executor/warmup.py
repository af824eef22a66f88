"""Start-up warm-up (``ExecutorConfig.warmup``): the first forward of a process pays for kernel set-up,
allocator growth and first touches of memory, and a first guided request for the grammar compiler's
tokenizer tables. Warming up pays them before any request arrives, outside every request's metrics and
the executor's statistics: the forwards run over scratch pages freed at once, and no drafter sees a
request (an NGram pool learns nothing from it)."""

from __future__ import annotations

import logging
import time

from .engine.engine_core import EngineCore
from .engine.scratch_forward import scratch_forward

logger = logging.getLogger("specexec")


def warm_up(core: EngineCore) -> float:
    """Run the target over a decode and a verify shape, each model of the drafter once, and (when the
    model has a tokenizer) one grammar compile; returns the seconds it took."""
    start = time.perf_counter()
    runner, block_manager = core.runner, core.block_manager
    context = block_manager.block_size
    scratch_forward(runner, block_manager, 1, context_len=context)  # a decode step
    drafter = core.speculation.drafter
    if drafter is not None:
        scratch_forward(runner, block_manager, 1 + drafter.max_draft_len, context_len=context)  # verify
        drafter.warm_up()
    if core.guided.tokenizer is not None:
        core.guided.pool.warm_up()  # builds the compiler's tokenizer tables, compiles a tiny schema
    seconds = time.perf_counter() - start
    logger.info("warm-up took %.2f s", seconds)
    return seconds
