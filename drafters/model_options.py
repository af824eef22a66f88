"""The ``speculative_config`` keys every drafter that runs a model of its own takes (DraftTarget,
EAGLE-3): where the model is, greedy or sampled drafts, and the draft's KV pool."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def check_path(key: str, value) -> None:
    if value is not None and (not isinstance(value, str) or not Path(value).expanduser().exists()):
        raise ValueError(
            f"{key}: {value!r} does not exist (a model directory, a .gguf file or a head directory)"
        )


@dataclass(slots=True)
class DraftModelOptions:
    speculative_model: str | None = None  #: draft model path (HF dir or GGUF)
    speculative_model_dir: str | None = None  #: trtllm-bench's name for the same
    sample_drafts: bool = False  #: sample drafts and keep q (rejection sampling), else greedy drafts
    kv_cache_memory_gb: float = 0.25  #: the draft's KV pool

    def __post_init__(self) -> None:
        check_path("speculative_model", self.speculative_model)
        check_path("speculative_model_dir", self.speculative_model_dir)
        if not isinstance(self.sample_drafts, bool):
            raise ValueError(f"sample_drafts must be true or false, got {self.sample_drafts!r}")
        value = self.kv_cache_memory_gb
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ValueError(f"kv_cache_memory_gb must be a number > 0, got {value!r}")

    @property
    def model_path(self) -> str | None:
        """``speculative_model``, or trtllm-bench's ``speculative_model_dir``."""
        return self.speculative_model or self.speculative_model_dir
