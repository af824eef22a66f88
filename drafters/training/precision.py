"""Which precision `specexec train-eagle3` and `specexec train-medusa` run their training steps in.

float32, or bfloat16 autocast (matmuls in bfloat16; weights, optimizer state, softmax and loss stay
float32). ``auto``: float32 on a CPU without native bfloat16 arithmetic (there bfloat16 is emulated,
many times slower); elsewhere the first optimizer steps alternate the two, each timed per trained
position, and the faster wins for the rest of the run. Those trial steps are real steps: nothing is
spent on a separate benchmark. (On one AVX512-BF16 CPU a SmolLM2-sized head's step took 0.6x float32's
time in bfloat16.)
"""

from __future__ import annotations

import contextlib
import statistics

import torch

from ...executor.layers.cpu_info import native_bf16_flags

CHOICES = ("auto", "float32", "bfloat16")
TRIAL_STEPS = 3  #: timed steps per precision before ``auto`` decides (median: the first may warm up)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class TrainingPrecision:
    def __init__(self, choice: str = "auto", device_type: str = "cpu") -> None:
        if choice not in CHOICES:
            raise ValueError(f"--train-dtype must be one of {', '.join(CHOICES)}, got {choice!r}")
        self.device_type = device_type
        self.reason = f"--train-dtype {choice}"
        if choice == "auto" and device_type == "cpu" and not native_bf16_flags():
            choice, self.reason = "float32", "auto: no native bfloat16 on this CPU"
        self.chosen: str | None = None if choice == "auto" else choice
        self.seconds_per_position: dict[str, list[float]] = {"float32": [], "bfloat16": []}

    def next(self) -> str:
        """The precision of the next step: the chosen one, or while trying, the one timed less."""
        if self.chosen is not None:
            return self.chosen
        fp32, bf16 = (len(self.seconds_per_position[k]) for k in ("float32", "bfloat16"))
        return "bfloat16" if bf16 < fp32 else "float32"

    def autocast(self, precision: str):
        """The context a forward runs in (the backward runs outside it)."""
        if precision == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=DTYPES[precision])

    def record(self, precision: str, seconds: float, positions: int) -> None:
        """One step's time; once both precisions have `TRIAL_STEPS`, ``auto`` picks the faster."""
        if self.chosen is not None:
            return
        self.seconds_per_position[precision].append(seconds / max(positions, 1))
        if all(len(v) >= TRIAL_STEPS for v in self.seconds_per_position.values()):
            fp32, bf16 = (statistics.median(self.seconds_per_position[k]) for k in ("float32", "bfloat16"))
            self.chosen = "bfloat16" if bf16 < fp32 else "float32"
            self.reason = f"auto: a bfloat16 step took {bf16 / fp32:.2f}x a float32 one per position"

    def summary(self) -> dict:
        return {
            "chosen": self.chosen,
            "reason": self.reason,
            "trial_us_per_position": {
                k: [round(s * 1e6, 1) for s in v] for k, v in self.seconds_per_position.items() if v
            },
        }
