"""Executor configuration: dataclasses built from Python or from YAML, validated with clear errors."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .engine.options import reject_unknown_keys
from .engine.speculation.speculative_config import SpeculativeConfig
from .kernel_plan.dense_backend import check_cpu_linear
from .kernel_plan.quantized_kernel import check_quantized_kernel
from .layers.quantized.quantization import check_quantization
from .model.decoder.convert import check_model_impl

DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")
GUIDED_UNSUPPORTED = ("refuse", "warn")


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ValueError(f"config key {key!r}: got {value!r}; allowed: {allowed}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


@reject_unknown_keys
@dataclass(slots=True)
class ExecutorConfig:
    """How the executor loads the model and sizes its batch and KV cache."""

    option_label = "config key"  #: (not a field) errors say "unknown config key 'x'"

    model: str | None = None  #: HF directory, GGUF file, or None for the embedded SmolLM2-135M-Instruct
    #: weights and KV cache of a model the executor loads: auto, float32, bfloat16, float16, float64. auto:
    #: bfloat16 on CUDA, and on a CPU with native bf16 where a one-time measurement finds it faster;
    #: float32 elsewhere (`executor/kernel_plan/dtype.py`). A module passed in keeps its own.
    dtype: str = "auto"
    #: "auto" (cuda when available, else cpu), "cpu", "cuda", "cuda:N"; a model passed in as a module
    #: stays where it is under "auto" and moves (in place) to a device named here
    device: str = "auto"
    device_map: str | None = None  #: accelerate placement over several devices, e.g. "auto"
    #: weight-only quantization of the linear layers (vLLM's key): auto (the default: a GGUF file at its
    #: own codes as ``gguf``, wherever its kernels run; any other model as loaded: `executor/auto_defaults.py`),
    #: none or null (weights as loaded: a GGUF dequantized), int8 (per output channel), int4 (groups of
    #: 32), gguf (a GGUF file's own Q4_0/Q4_1/Q4_K codes, and Q5_0/Q5_1/Q5_K/Q6_K/Q8_0 where int8_dot
    #: runs; the rest dequantized: `layers/quantized/gguf_weights.py`). Kernels:
    #: `executor/layers/quantized/quantized_linear.py`; a device without one is refused
    quantization: str | None = "auto"
    #: the forward (vLLM's key): auto, specexec, transformers. specexec: its own decoder for the Llama
    #: family (Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3), fused QKV and gate/up weights, a fixed
    #: sequence of ops per layer (`executor/model/decoder/`); transformers: transformers' modules with
    #: paged attention plugged in; auto: specexec where the architecture is supported, else transformers
    model_impl: str = "auto"
    #: a CPU model's dense linear layers: auto, blas (torch's F.linear), onednn (weights packed once
    #: for oneDNN, the drafter's models too). auto measures both once per CPU and model shape and keeps
    #: the faster (`executor/kernel_plan/dense_backend.py`); on CUDA and for float64/float16: blas
    cpu_linear: str = "auto"
    #: a CPU model's quantized layers (decode, verify, prefill chunks): auto, torch (torch's weight-only kernels,
    #: exact in float32), int8_dot (C++ integer dot products over activations quantized to int8 in blocks
    #: of 32, llama.cpp's way). auto times both once per CPU and model and takes int8_dot for the row
    #: counts where it is faster (`executor/kernel_plan/quantized_kernel.py`); on CUDA: torch
    quantized_kernel: str = "auto"
    max_batch_size: int = 16  #: requests in one forward at most
    max_num_tokens: int = 2048  #: tokens in one forward at most (prefill chunks + decode + draft tokens)
    max_model_len: int | None = None  #: context length; None = the model's, capped by the KV pool
    block_size: int = 16  #: tokens per KV page
    kv_cache_memory_gb: float = 1.0  #: KV pool budget in GiB (ignored when num_kv_blocks is set)
    num_kv_blocks: int | None = None  #: exact number of KV pages (tests use small pools)
    capture_hidden_layers: list[int] = field(default_factory=list)  #: hidden_states indices to capture
    cache_dir: str | None = None  #: where converted GGUF models are cached (default ~/.cache/specexec)
    #: seconds a start may spend measuring this machine's kernel plan (`executor/kernel_plan/`): past
    #: them, or while other work takes the CPUs, a choice with nothing stored takes this ISA's static
    #: default and is measured at the next quiet start or by `specexec tune`; null: no bound
    measuring_budget_s: float | None = 30.0
    progress: bool = True  #: transformers' progress bars while a model loads (false: quiet)
    #: at start-up, one tiny forward of each model and one grammar compile, outside every metric, so
    #: that the first request pays no cold start (on in `specexec run`; `Executor.setup.warmup_seconds`)
    warmup: bool = False
    #: drafter settings (trtllm-bench's block): {decoding_type: NGram, max_draft_len: 3, ...}; auto (the
    #: default: Suffix decoding under the auto draft-length policy, `executor/auto_defaults.py`); none or
    #: null = off
    speculative_config: SpeculativeConfig | str | None = "auto"
    #: guided requests: mask each drafting step with the grammar (off only for the ablation)
    draft_side_grammar_masks: bool = True
    #: JSON schemas: longest run of whitespace allowed (small models otherwise loop on whitespace);
    #: 0 = compact JSON, null = unlimited
    guided_json_max_whitespace: int | None = 16
    #: a JSON schema keyword the grammar cannot enforce (after normalization): "refuse" finishes the
    #: request with an error naming it; "warn" generates anyway and says so on the output
    guided_unsupported: str = "refuse"
    #: seconds a grammar may take to compile before its request fails (the compile thread is abandoned)
    grammar_compile_timeout_s: float = 30.0
    #: seconds one call into the drafter may take: a late call loses its drafts for that step, and a
    #: drafter late 3 times in a row is switched off; null = no deadline (calls run inline)
    drafter_timeout_s: float | None = 30.0
    #: on CUDA: capture the decode/verify forward of the target and of the drafter's models as CUDA
    #: graphs at start-up and replay them (prefill chunks and larger batches run eagerly); no effect on CPU
    cuda_graphs: bool = True
    #: share the K/V pages of a common prompt prefix between requests (vLLM's automatic prefix caching;
    #: `engine/block_manager.py`); `specexec serve` turns it on. Off for requests scoring their prompt and
    #: with EAGLE-3 or capture_hidden_layers (they need every position's hidden states)
    enable_prefix_caching: bool = False
    #: run the target over this many worker processes, sharded Megatron-style (`executor/parallel/`;
    #: CPU and gloo; the own decoder, dense or quantized); 1 = the single-process path
    tensor_parallel_size: int = 1
    #: how the ranks start: ``spawn`` (the executor's own worker processes, on this machine) or
    #: ``torchrun`` (the processes torchrun started, on this host or others; rank 0 is the executor)
    tensor_parallel_launch: str = "spawn"
    #: seconds a tensor-parallel step (or the workers' start-up) may take before its rank is declared
    #: hung and every worker is stopped
    tensor_parallel_timeout_s: float = 300.0
    #: (spawn) times the ranks are started again after a fault (the requests holding K/V fail, later
    #: ones run); past it every later request fails with the cause
    tensor_parallel_max_restarts: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.speculative_config, dict):
            self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
        if self.speculative_config == "none":
            self.speculative_config = None
        if self.quantization == "none":
            self.quantization = None
        self.validate()

    def validate(self) -> None:
        _check(self.model is None or isinstance(self.model, str), "model", self.model, "a path or null")
        _check(self.dtype in DTYPES, "dtype", self.dtype, ", ".join(DTYPES))
        check_quantization(self.quantization)
        check_model_impl(self.model_impl)
        check_cpu_linear(self.cpu_linear)
        check_quantized_kernel(self.quantized_kernel)
        _check(
            isinstance(self.device, str)
            and (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")),
            "device",
            self.device,
            "auto, cpu, cuda, cuda:N",
        )
        for key in ("max_batch_size", "max_num_tokens", "block_size"):
            value = getattr(self, key)
            _check(_is_int(value) and value > 0, key, value, "an integer > 0")
        _check(
            self.max_model_len is None or (_is_int(self.max_model_len) and self.max_model_len > 1),
            "max_model_len",
            self.max_model_len,
            "null or an integer > 1",
        )
        _check(
            _is_positive_number(self.kv_cache_memory_gb),
            "kv_cache_memory_gb",
            self.kv_cache_memory_gb,
            "a number > 0",
        )
        _check(
            self.num_kv_blocks is None or (_is_int(self.num_kv_blocks) and self.num_kv_blocks > 0),
            "num_kv_blocks",
            self.num_kv_blocks,
            "null or an integer > 0",
        )
        _check(
            isinstance(self.capture_hidden_layers, (list, tuple))
            and all(_is_int(i) and i >= 0 for i in self.capture_hidden_layers),
            "capture_hidden_layers",
            self.capture_hidden_layers,
            "a list of layer indices >= 0",
        )
        _check(
            isinstance(self.draft_side_grammar_masks, bool),
            "draft_side_grammar_masks",
            self.draft_side_grammar_masks,
            "true or false",
        )
        _check(
            self.guided_unsupported in GUIDED_UNSUPPORTED,
            "guided_unsupported",
            self.guided_unsupported,
            ", ".join(GUIDED_UNSUPPORTED),
        )
        _check(
            _is_positive_number(self.grammar_compile_timeout_s),
            "grammar_compile_timeout_s",
            self.grammar_compile_timeout_s,
            "a number of seconds > 0",
        )
        _check(
            self.measuring_budget_s is None or _is_positive_number(self.measuring_budget_s),
            "measuring_budget_s",
            self.measuring_budget_s,
            "null or a number of seconds > 0",
        )
        _check(
            self.drafter_timeout_s is None or _is_positive_number(self.drafter_timeout_s),
            "drafter_timeout_s",
            self.drafter_timeout_s,
            "null or a number of seconds > 0",
        )
        _check(isinstance(self.cuda_graphs, bool), "cuda_graphs", self.cuda_graphs, "true or false")
        _check(
            isinstance(self.enable_prefix_caching, bool),
            "enable_prefix_caching",
            self.enable_prefix_caching,
            "true or false",
        )
        _check(
            _is_int(self.tensor_parallel_size) and self.tensor_parallel_size >= 1,
            "tensor_parallel_size",
            self.tensor_parallel_size,
            "an integer >= 1",
        )
        _check(
            self.tensor_parallel_launch in ("spawn", "torchrun"),
            "tensor_parallel_launch",
            self.tensor_parallel_launch,
            "spawn or torchrun",
        )
        _check(
            _is_int(self.tensor_parallel_max_restarts) and self.tensor_parallel_max_restarts >= 0,
            "tensor_parallel_max_restarts",
            self.tensor_parallel_max_restarts,
            "an integer >= 0",
        )
        _check(
            _is_positive_number(self.tensor_parallel_timeout_s),
            "tensor_parallel_timeout_s",
            self.tensor_parallel_timeout_s,
            "a number of seconds > 0",
        )
        _check(isinstance(self.progress, bool), "progress", self.progress, "true or false")
        _check(isinstance(self.warmup, bool), "warmup", self.warmup, "true or false")
        _check(
            self.speculative_config in (None, "auto")
            or isinstance(self.speculative_config, SpeculativeConfig),
            "speculative_config",
            self.speculative_config,
            "auto, none (or null), or a mapping with decoding_type, max_draft_len and drafter options",
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecutorConfig:
        if not isinstance(data, dict):
            raise ValueError(f"config must be a mapping of keys to values, got {type(data).__name__}")
        return cls(**data)  # an unknown key is a ValueError naming it (reject_unknown_keys)

    @classmethod
    def from_yaml(cls, path: str | Path) -> ExecutorConfig:
        import yaml

        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"cannot read config file {str(path)!r}: {exc.strerror}") from exc
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
        return cls.from_dict(data)
