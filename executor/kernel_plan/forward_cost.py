"""What a target forward costs on this machine: seconds over 1..n new tokens of one sequence and of
decode steps of b sequences (`engine/speculation/draft_length.ForwardCostModel`, the curve the
draft-length policy prices drafts with), timed once per model, dtype, kernels and machine and kept in
the measurement store. Measured after the rest of the plan has run and the CUDA graphs are captured,
so that what is timed is the forward as it will run."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..config import ExecutorConfig
from ..engine.block_manager import BlockManager
from ..engine.scratch_forward import scratch_decode, scratch_forward
from ..engine.speculation.draft_length import ForwardCostModel
from ..layers.measurement.cache_folder import resolve_cache_dir
from ..layers.packed_linear import PackedLinear
from ..model.model_runner import ModelRunner
from .measurement.store import STATIC_FIELD, cached_measurement, machine_key, median_seconds
from .static_defaults import case_name, static_default

logger = logging.getLogger("specexec")

MEASURED_SIZES = (1, 2, 3, 4, 8, 16, 32, 64)  #: 3 and 4: MKL's small-matrix path ends at 3 rows
MEASURED_BATCH_SIZES = (1, 2, 4, 8, 16)  #: decode steps of this many sequences (up to max_batch_size)
#: a stored curve whose smallest forward took over this many times a fresh one was measured on a busier
#: machine: it is measured again (one slower now is kept: the machine is the busier one now)
STALE_FACTOR = 1.5


def target_forward_cost(
    config: ExecutorConfig, model: torch.nn.Module, runner: ModelRunner, block_manager: BlockManager
) -> ForwardCostModel:
    """The target's curve, over the sizes its steps can have (``max_num_tokens`` and the KV pool bound
    them), timed on scratch pages of ``block_manager``."""
    limit = min(config.max_num_tokens, block_manager.capacity_tokens)
    sizes = tuple(n for n in MEASURED_SIZES if n <= limit) or (1,)
    batch_limit = min(config.max_batch_size, limit, block_manager.num_blocks)
    batch_sizes = tuple(b for b in MEASURED_BATCH_SIZES if b <= batch_limit)
    key = cost_cache_key(model) + ("|cuda graphs" if runner.graphs is not None else "")
    key += f"|decode batches {batch_sizes}"  # (max_batch_size and the pool bound them)
    return stored_forward_cost(
        key,
        lambda n: scratch_forward(runner, block_manager, n),
        resolve_cache_dir(config.cache_dir),
        sizes,
        lambda b: scratch_decode(runner, block_manager, b),
        batch_sizes,
        static_case={"dtype": next(model.parameters()).dtype, "codes": _holds_codes(model)},
    )


def _holds_codes(model: torch.nn.Module) -> bool:
    """Whether the model's linear layers run quantized codes (integer buffers), not dense weights."""
    return any(b.dtype in (torch.uint8, torch.int8) for b in model.buffers())


def measure_forward_cost(
    forward_n_tokens, sizes=MEASURED_SIZES, repeats: int = 3, decode_batch=None, batch_sizes=()
) -> ForwardCostModel:
    """``forward_n_tokens(n)`` runs one forward over n new tokens, ``decode_batch(b)`` one decode step of
    b sequences; the median of repeats is kept."""

    def timed(run, n) -> float:
        run(n)  # warm-up
        return median_seconds(lambda: run(n), repeats)

    seconds = [timed(forward_n_tokens, n) for n in sizes]
    batch_seconds = [timed(decode_batch, b) for b in batch_sizes] if decode_batch else []
    return ForwardCostModel(list(sizes), seconds, list(batch_sizes) if decode_batch else [], batch_seconds)


def stored_forward_cost(
    key: str,
    forward_n_tokens,
    cache_dir: Path | None,
    sizes=MEASURED_SIZES,
    decode_batch=None,
    batch_sizes=(),
    static_case: dict | None = None,
) -> ForwardCostModel:
    """The curve for ``key`` from the store, or measured (`measure_forward_cost`) and stored;
    ``static_case``: what picks this ISA's static curve (`static_defaults.py`, its seconds relative to
    one forward's) for a start that does not measure; None: always measured."""

    def measure() -> dict:
        curve = measure_forward_cost(
            forward_n_tokens, sizes, decode_batch=decode_batch, batch_sizes=batch_sizes
        )
        return {
            "num_tokens": curve.num_tokens,
            "seconds": curve.seconds,
            "batch_sizes": curve.batch_sizes,
            "batch_seconds": curve.batch_seconds,
        }

    def measured_on_a_busier_machine(cached: dict) -> bool:
        try:
            n, then = int(cached["num_tokens"][0]), float(cached["seconds"][0])
        except (TypeError, ValueError, IndexError, KeyError):
            return True  # not a curve: measure it
        if decode_batch is not None and list(cached.get("batch_sizes", [])) != list(batch_sizes):
            return True  # measured for other batch sizes (or before they were measured)
        forward_n_tokens(n)  # warm-up
        now = median_seconds(lambda: forward_n_tokens(n), 3)
        if then <= STALE_FACTOR * now:
            return False
        logger.info(
            "the stored forward cost has %.1f ms for %d tokens, %.1fx a forward now: measuring again",
            then * 1e3, n, then / now,
        )  # fmt: skip
        return True

    what = f"measuring the target's forward cost over 1..{sizes[-1]} tokens"
    needs = ("num_tokens", "seconds")
    case = case_name(
        sizes=tuple(sizes), batch_sizes=tuple(batch_sizes) if decode_batch else (), **(static_case or {})
    )
    default = static_default("forward-cost", case) if static_case is not None else None
    data = cached_measurement(
        cache_dir, "forward-cost", key, measure, what, needs, measured_on_a_busier_machine, default
    )
    if STATIC_FIELD in data:  # a level's curve relative to one forward: priced by one forward timed now
        forward_n_tokens(1)  # warm-up
        one = median_seconds(lambda: forward_n_tokens(1), 3)
        data = {**data, "seconds": [one * s for s in data["seconds"]]}
        data["batch_seconds"] = [one * s for s in data.get("batch_seconds", [])]
    return ForwardCostModel(
        data["num_tokens"], data["seconds"], data.get("batch_sizes", []), data.get("batch_seconds", [])
    )


def cost_cache_key(model: torch.nn.Module) -> str:
    param = next(model.parameters())
    num_params = sum(p.numel() for p in model.parameters())
    # quantized weights are buffers: their bytes tell an int8 model from an int4 one of the same params
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    name = getattr(model.config, "_name_or_path", "") or type(model).__name__
    # packed layers' weights are neither: their count tells a oneDNN model from the same model on BLAS,
    # their row bands one that runs only some row counts on oneDNN
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    bands = sorted({m.describe_kernels() for m in packed})
    # on the CPU what every measurement's key names (`machine_key`: the CPU, torch, the kernels' build)
    where = machine_key() if param.device.type == "cpu" else torch.cuda.get_device_name(param.device)
    return (
        f"{name}|{num_params}|buffers={buffer_bytes}|packed={len(packed)}|rows={bands}|{param.dtype}"
        f"|{param.device}|{where}|threads={torch.get_num_threads()}"
    )
