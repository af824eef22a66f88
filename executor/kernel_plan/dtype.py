"""``dtype: auto``: bfloat16 where it is native and measured faster, float32 elsewhere.

- CUDA: bfloat16.
- A CPU without native bfloat16 arithmetic (no AVX512-BF16, no AMX): float32. There bf16 matmuls are
  emulated; on one of this project's machines they ran at 0.3 GFLOP/s.
- A CPU with it: a start-up measurement decides. One decode step's work for the model's shapes — every
  layer's q/k/v/o and MLP projections (through the quantized kernels when ``quantization`` is set: their
  speed differs between dtypes far more than a dense matmul's; int8_dot's where ``quantized_kernel``
  allows it and the C++ kernels load, torch's otherwise) and attention over 1,024 cached keys (the C++
  kernel over pages where it runs, as decode and verify rows take it, a cache a layer: float32's is
  twice the bytes to read), then the LM head (a GGUF's Q8_0
  head in int8 blocks on int8_dot, as loaded, where int8_dot runs) — runs in
  both dtypes for 1 and 4 new tokens, on enough distinct weights to stream from memory as the real
  forward does, the two dtypes taking turns (so the machine's drift falls on both alike); bfloat16 wins
  when it takes under `BF16_MARGIN` of float32's time in every turn (a difference the noise between
  turns does not cover: a model near the margin keeps the default, float32, rather than flipping
  between starts), else float32. The answer is cached
  per CPU, torch version, thread count and model shape (like the forward-cost curve), so it is measured
  once per machine.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.attention_kernels import attend
from ..layers.cpu_info import describe_cpu, native_bf16_flags
from ..layers.paged_attention_cpu import attend_paged_cpu, paged_cpu_kernel_runs
from ..layers.quantized.q8_block_linear import Int8BlockLinear
from ..layers.quantized.quantized_dot import BLOCK, MAX_ROWS, TILE, int8_dot_loads
from ..layers.quantized.quantized_linear import (
    Int4WeightOnlyLinear,
    Int8WeightOnlyLinear,
    fits_int4,
    kernel_scheme,
)
from .measurement.store import cached_measurement, machine_key, median_seconds
from .static_defaults import case_name, static_default

logger = logging.getLogger("specexec")

MEASUREMENT_VERSION = (
    9  #: bump when the measured work changes (attention path, quantization, int8_dot): old answers are stale
)
BF16_MARGIN = 0.9  #: bfloat16 must take under this fraction of float32's time in every turn to be chosen
#: a dtype whose warm-up step takes this many times the other's is not timed again (see measure_bf16_ratio)
CLEARLY_SLOWER = 4.0
CONTEXT = 1024  #: cached keys each measured attention call reads
STREAMED_BYTES = 128 * 2**20  #: float32 weights the measurement cycles through (beyond any cache)
PAGE_SIZE = 16  #: the measured pool's pages: one request on consecutive pages
PAGES = torch.arange(CONTEXT // PAGE_SIZE)[None]  # [1, pages]
KV_LENS = torch.tensor([CONTEXT])


@dataclass(frozen=True, slots=True)
class ModelShape:
    hidden: int
    intermediate: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int
    vocab: int

    @classmethod
    def from_config(cls, config: dict) -> ModelShape:
        """From transformers config keys; what is missing is a 1B-class default."""
        hidden = int(config.get("hidden_size") or 2048)
        heads = int(config.get("num_attention_heads") or 16)
        return cls(
            hidden=hidden,
            intermediate=int(config.get("intermediate_size") or 4 * hidden),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            num_layers=int(config.get("num_hidden_layers") or 16),
            vocab=int(config.get("vocab_size") or 32000),
        )


@dataclass(frozen=True, slots=True)
class Bf16Timing:
    """bfloat16's time over float32's: the median over the measurement's turns, and each turn's."""

    ratio: float
    turns: tuple[float, ...]

    def every_turn_under(self, margin: float) -> bool:
        """Whether bfloat16 took under ``margin`` of float32's time in every turn."""
        return all(turn < margin for turn in self.turns)

    def describe(self) -> str:
        spread = f" ({min(self.turns):.2f}-{max(self.turns):.2f}x over {len(self.turns)} turns)"
        return f"bfloat16 took {self.ratio:.2f}x float32's time" + (spread if len(self.turns) > 1 else "")


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    dtype: str  #: float32, bfloat16, ...
    reason: str  #: one line: why (printed by `specexec run`)


def choose_dtype(
    device: torch.device,
    shape_config: dict,
    cache_dir: Path | None,
    quantization: str | None = None,
    quantized_kernel: str = "auto",
) -> DtypeChoice:
    """What ``dtype: auto`` loads in on this machine for a model quantized as ``quantization`` with
    ``quantized_kernel`` (see the module docstring)."""
    if device.type == "cuda":
        return DtypeChoice("bfloat16", "auto: CUDA")
    if not native_bf16_flags():
        return DtypeChoice("float32", f"auto: no native bfloat16 on {describe_cpu()}")
    if not shape_config.get("hidden_size"):  # e.g. a path that does not exist: let the load say so
        return DtypeChoice("float32", "auto: the model's shape could not be read before loading")
    shape = ModelShape.from_config(shape_config)
    int8_dot = quantization is not None and quantized_kernel != "torch" and int8_dot_loads()
    timing = _cached_bf16_ratio(shape, cache_dir, quantization, int8_dot)
    verdict = "bfloat16" if timing.every_turn_under(BF16_MARGIN) else "float32"
    weights = f" with {quantization} weights" if quantization else ""
    unclear = (
        f"; not under {BF16_MARGIN}x in every turn" if timing.ratio < BF16_MARGIN <= max(timing.turns) else ""
    )
    return DtypeChoice(verdict, f"auto: {timing.describe()}{weights} on {describe_cpu()}{unclear}")


def _cached_bf16_ratio(
    shape: ModelShape, cache_dir: Path | None, quantization: str | None, int8_dot: bool = False
) -> Bf16Timing:
    key = f"v{MEASUREMENT_VERSION}|{machine_key()}|{shape}|quantization={quantization}|int8_dot={int8_dot}"

    def measure() -> dict:
        timing = measure_bf16_ratio(shape, quantization, int8_dot=int8_dot)
        return {"bf16_ratio": timing.ratio, "bf16_turns": list(timing.turns)}

    data = cached_measurement(
        cache_dir,
        "dtype-choice",
        key,
        measure,
        "dtype auto: timing bfloat16 against float32 on this CPU",
        ("bf16_ratio", "bf16_turns"),
        default=static_default("dtype-choice", case_name(quantization=quantization, int8_dot=int8_dot)),
    )
    try:
        return Bf16Timing(float(data["bf16_ratio"]), tuple(float(t) for t in data["bf16_turns"]))
    except (TypeError, ValueError):  # a damaged cache file: measure again, uncached
        return measure_bf16_ratio(shape, quantization, int8_dot=int8_dot)


def measure_bf16_ratio(
    shape: ModelShape, quantization: str | None = None, repeats: int = 5, int8_dot: bool = False
) -> Bf16Timing:
    """bfloat16's time over float32's for one decode step's work at 1 and 4 new tokens (summed), in
    ``repeats`` turns, each dtype's step once a turn. Where one dtype's first (warm-up) step takes over
    `CLEARLY_SLOWER` times the other's, the answer is clear and the warm-ups' ratio is kept: no repeats of
    the slow one (float32 with int4 weights took 16x bfloat16's time on the AVX512-BF16 EPYC, and its
    repeats were most of the start-up)."""
    steps, warm = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        steps[dtype] = DecodeStepWork(shape, dtype, quantization, int8_dot)
        started = time.perf_counter()
        steps[dtype].run(1)  # warm-up
        warm[dtype] = time.perf_counter() - started
    ratio = warm[torch.bfloat16] / warm[torch.float32]
    if not 1 / CLEARLY_SLOWER < ratio < CLEARLY_SLOWER:
        return Bf16Timing(ratio, (ratio,))
    turns = []
    for _ in range(repeats):  # the dtypes take turns: a drift of the machine falls on both alike
        seconds = {
            dtype: sum(median_seconds(lambda n=n, run=step.run: run(n), 1) for n in (1, 4))
            for dtype, step in steps.items()
        }
        turns.append(seconds[torch.bfloat16] / seconds[torch.float32])
    return Bf16Timing(sorted(turns)[len(turns) // 2], tuple(turns))


class DecodeStepWork:
    """Random weights of a few distinct layers (enough to stream from memory) and the LM head; `run`
    does every layer's projections and attention (cycling through the distinct layers) and the head."""

    def __init__(
        self, shape: ModelShape, dtype: torch.dtype, quantization: str | None = None, int8_dot: bool = False
    ) -> None:
        s = shape
        scheme = kernel_scheme(quantization)

        def weight(rows: int, cols: int, quantize: bool = True) -> nn.Module:
            layer = nn.Linear(cols, rows, bias=False, dtype=dtype).requires_grad_(False)
            layer.weight.uniform_(-0.02, 0.02)
            if scheme is None or not quantize:
                return layer
            quantized = (
                Int4WeightOnlyLinear if scheme == "int4" and fits_int4(layer) else Int8WeightOnlyLinear
            )(layer)
            if int8_dot:
                quantized.set_int8_dot_rows(MAX_ROWS)
            return quantized

        q_out, kv_out = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        layer_floats = s.hidden * (q_out + 2 * kv_out) + q_out * s.hidden + 3 * s.hidden * s.intermediate
        num_distinct = max(1, min(s.num_layers, STREAMED_BYTES // (4 * layer_floats)))
        self.layers = [
            (
                weight(q_out + 2 * kv_out, s.hidden),  # qkv
                weight(s.hidden, q_out),  # o
                weight(2 * s.intermediate, s.hidden),  # gate, up
                weight(s.hidden, s.intermediate),  # down
            )
            for _ in range(num_distinct)
        ]
        self.keys = torch.empty(1, s.num_kv_heads, CONTEXT, s.head_dim, dtype=dtype).uniform_(-1, 1)
        self.values = torch.empty(1, s.num_kv_heads, CONTEXT, s.head_dim, dtype=dtype).uniform_(-1, 1)
        # one request's pages for the C++ kernel, [2, slots, kv_heads, head_dim], a pool a layer (up to
        # STREAMED_BYTES of them): a forward reads every layer's cache from memory, twice the bytes in
        # float32 as in bfloat16, where one pool read again would stay in cache
        pool = torch.stack([self.keys[0].transpose(0, 1), self.values[0].transpose(0, 1)]).contiguous()
        num_pools = max(1, min(s.num_layers, STREAMED_BYTES // (pool.numel() * pool.element_size())))
        self.pools = [pool] + [torch.empty_like(pool).uniform_(-1, 1) for _ in range(num_pools - 1)]
        self.paged = paged_cpu_kernel_runs(self.keys)
        # gguf: a Q8_0 head is int8 blocks on int8_dot where it runs, else dense in float32 and int8 per row
        # in bfloat16 (`quantization.py`)
        if quantization == "gguf" and int8_dot and s.vocab % TILE == 0 and s.hidden % BLOCK == 0:
            self.head = _q8_0_head(s.vocab, s.hidden, dtype)
        else:
            self.head = weight(s.vocab, s.hidden, quantize=quantization != "gguf" or dtype != torch.float32)
        self.shape, self.dtype = s, dtype

    def map_linears(self, fn) -> None:
        """Replace every layer by ``fn(layer)`` (e.g. to time another linear backend on the same work)."""
        self.layers = [tuple(fn(layer) for layer in group) for group in self.layers]
        self.head = fn(self.head)

    @torch.inference_mode()
    def run(self, num_tokens: int) -> None:
        s = self.shape
        x = torch.randn(num_tokens, s.hidden).to(self.dtype)  # [n, hidden]
        for i in range(s.num_layers):
            qkv, o, gate_up, down = self.layers[i % len(self.layers)]
            q = qkv(x)[:, : s.num_heads * s.head_dim]  # [n, heads * head_dim]
            q = q.view(1, num_tokens, s.num_heads, s.head_dim)  # [1, n, heads, head_dim]
            if self.paged:  # the C++ kernel over the pages, as the executor's decode and verify rows run
                positions = torch.arange(CONTEXT - num_tokens, CONTEXT)[None]  # [1, n]
                a = attend_paged_cpu(
                    q,
                    self.pools[i % len(self.pools)],
                    PAGES,
                    positions,
                    KV_LENS,
                    PAGE_SIZE,
                    s.head_dim**-0.5,
                    None,
                    None,
                )  # [1, n, heads, head_dim]
            else:  # the unmeasured default kernel (the executor's own choice is timed later, in the chosen dtype)
                a = attend(q.transpose(1, 2), self.keys, self.values, None, s.head_dim**-0.5, None).transpose(
                    1, 2
                )
            x = x + o(a.reshape(num_tokens, -1))
            g, u = gate_up(x).chunk(2, dim=-1)  # [n, intermediate] each
            x = x + down(F.silu(g) * u)
        self.head(x)  # [n, vocab]


def _q8_0_head(vocab: int, hidden: int, dtype: torch.dtype) -> Int8BlockLinear:
    """A GGUF's Q8_0 LM head as `quantization.py` loads it where int8_dot runs: random int8 blocks."""
    linear = torch.nn.utils.skip_init(nn.Linear, hidden, vocab, bias=False, dtype=dtype).requires_grad_(False)
    q = torch.randint(-127, 128, (vocab, hidden), dtype=torch.int8)
    return Int8BlockLinear(
        linear, q, torch.full((vocab, hidden // BLOCK), 2.0**-10)
    )  # a float16 d, as Q8_0's
