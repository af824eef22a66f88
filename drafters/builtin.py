"""The built-in drafters, registered with the plugin manager like any third-party plugin. Each factory
declares its options dataclass (`declare_options`), so a bad option is refused before any model loads;
the factory then parses the same options again to build its drafter."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..executor.engine.options import parse_options, reject_unknown_keys
from ..executor.layers.quantized.quantization import check_quantization
from ..plugins import hookimpl
from .base import Drafter, DrafterContext, declare_options
from .layer_skip.options import LayerSkipOptions
from .lookahead.options import LookaheadOptions
from .medusa.factory import make_medusa
from .retrieval.rest import REST_SPEC_FACTOR, REST_SPEC_OFFSET
from .retrieval.suffix_index import DEFAULT_LIMITS

logger = logging.getLogger("specexec")


def _check_path(key: str, value) -> None:
    if value is not None and (not isinstance(value, str) or not Path(value).expanduser().exists()):
        raise ValueError(
            f"{key}: {value!r} does not exist (a model directory, a .gguf file or a head directory)"
        )


def _check_kv_budget(value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"kv_cache_memory_gb must be a number > 0, got {value!r}")


@reject_unknown_keys
@dataclass(slots=True)
class NGramOptions:
    """NGram's own options (TensorRT-LLM's names); `NGramConfig` documents each one."""

    option_label = "NGram option"  #: (not a field) for the unknown-option error
    max_matching_ngram_size: int = 3
    is_public_pool: bool = True
    is_keep_all: bool = True
    is_use_oldest: bool = True
    max_pool_entries: int = 1_000_000

    def __post_init__(self) -> None:
        from .ngram import NGramConfig

        NGramConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})  # checks values


@reject_unknown_keys
@dataclass(slots=True)
class SuffixOptions:
    """Suffix decoding's own options (vLLM's ``suffix_decoding_*`` names without the prefix);
    `SuffixConfig` documents each one."""

    option_label = "Suffix option"  #: (not a field) for the unknown-option error
    max_tree_depth: int = DEFAULT_LIMITS.max_depth
    max_cached_requests: int = 1000
    max_spec_factor: float = DEFAULT_LIMITS.max_spec_factor
    max_spec_offset: float = DEFAULT_LIMITS.max_spec_offset
    min_token_prob: float = DEFAULT_LIMITS.min_token_prob
    max_occurrences: int = DEFAULT_LIMITS.max_occurrences

    def __post_init__(self) -> None:
        from .retrieval.suffix import SuffixConfig

        SuffixConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})  # checks values


@reject_unknown_keys
@dataclass(slots=True)
class RestOptions:
    """REST's options: the datastore, and the lookup's limits as Suffix names them; `RestConfig`
    documents each one."""

    option_label = "REST option"  #: (not a field) for the unknown-option error
    datastore: str | None = None
    max_tree_depth: int = DEFAULT_LIMITS.max_depth
    max_spec_factor: float = REST_SPEC_FACTOR
    max_spec_offset: float = REST_SPEC_OFFSET
    min_token_prob: float = DEFAULT_LIMITS.min_token_prob
    max_occurrences: int = DEFAULT_LIMITS.max_occurrences

    def __post_init__(self) -> None:
        from .retrieval.rest import RestConfig

        RestConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})  # checks values
        if not Path(self.datastore).expanduser().is_file():
            raise ValueError(
                f"datastore: {self.datastore!r} is not a file (build one with `specexec build-datastore`)"
            )


@dataclass(slots=True)
class _DraftModelOptions:
    """The keys of the drafters that run a model of their own."""

    speculative_model: str | None = None  #: draft model path (HF dir or GGUF)
    speculative_model_dir: str | None = None  #: trtllm-bench's name for the same
    sample_drafts: bool = False  #: sample drafts and keep q (rejection sampling), else greedy drafts
    kv_cache_memory_gb: float = 0.25  #: the draft's KV pool

    def __post_init__(self) -> None:
        _check_path("speculative_model", self.speculative_model)
        _check_path("speculative_model_dir", self.speculative_model_dir)
        if not isinstance(self.sample_drafts, bool):
            raise ValueError(f"sample_drafts must be true or false, got {self.sample_drafts!r}")
        _check_kv_budget(self.kv_cache_memory_gb)


@reject_unknown_keys
@dataclass(slots=True)
class DraftTargetOptions(_DraftModelOptions):
    """``speculative_model`` None = a quantized copy of the target (the self-draft)."""

    option_label = "DraftTarget option"  #: (not a field) for the unknown-option error
    #: the draft model's weight-only quantization (as the executor's: auto, none, int8, int4, gguf); auto
    #: = int8 for the self-draft, for a draft model the executor's rule (a GGUF at its own codes)
    quantization: str | None = "auto"

    def __post_init__(self) -> None:
        _DraftModelOptions.__post_init__(self)
        check_quantization(self.quantization)


@reject_unknown_keys
@dataclass(slots=True)
class Eagle3Options(_DraftModelOptions):
    """``speculative_model`` is an EAGLE-3 head directory (None = the head shipped for the embedded
    SmolLM2)."""

    option_label = "Eagle option"  #: (not a field) for the unknown-option error
    #: the request's own text drafts where the head is unsure (prompt lookup; false: the head alone)
    prompt_lookup: bool = True
    #: the head's weights: auto (int8 where measured faster on this CPU), int8, or null (as loaded);
    #: see `head_quantization.py`
    head_quantization: str | None = "auto"
    tree_growth: str = "dynamic"  #: how ``draft_tree`` grows (`eagle3.drafter.TREE_GROWTHS`)

    def __post_init__(self) -> None:
        from ..executor.kernel_plan.head_quantization import check_setting
        from .eagle3.drafter import TREE_GROWTHS

        _DraftModelOptions.__post_init__(self)
        if not isinstance(self.prompt_lookup, bool):
            raise ValueError(f"prompt_lookup must be true or false, got {self.prompt_lookup!r}")
        check_setting(self.head_quantization)
        if self.tree_growth not in TREE_GROWTHS:
            raise ValueError(
                f"tree_growth must be one of {', '.join(TREE_GROWTHS)}, got {self.tree_growth!r}"
            )


@reject_unknown_keys
@dataclass(slots=True)
class UserProvidedOptions:
    option_label = "UserProvided option"  #: (not a field) for the unknown-option error
    drafter: str | None = None  #: "package.module:ClassName", a specexec Drafter subclass
    drafter_options: dict = field(default_factory=dict)  #: keyword arguments of its constructor

    def __post_init__(self) -> None:
        self.drafter_class()

    def drafter_class(self) -> type[Drafter]:
        """The class named by ``drafter`` (imported, checked; its constructor takes drafter_options)."""
        target = self.drafter
        if not isinstance(target, str) or ":" not in target:
            raise ValueError(f"UserProvided needs option drafter: 'package.module:ClassName', got {target!r}")
        module_name, _, class_name = target.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import drafter {target!r}: {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, Drafter)):
            raise ValueError(f"{target!r} is not a subclass of specexec.drafters.Drafter")
        if not isinstance(self.drafter_options, dict):
            raise ValueError(f"drafter_options must be a mapping, got {self.drafter_options!r}")
        try:
            inspect.signature(cls).bind_partial(**self.drafter_options)
        except TypeError as exc:
            raise ValueError(f"drafter_options do not fit {target}'s constructor: {exc}") from exc
        return cls


@declare_options(NGramOptions)
def make_ngram(spec_config, context: DrafterContext) -> Drafter:
    from .ngram import NGramConfig, NGramDrafter

    opts = parse_options(NGramOptions, spec_config.options)
    fields = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
    return NGramDrafter(NGramConfig(max_draft_len=spec_config.max_draft_len, **fields))


@declare_options(SuffixOptions)
def make_suffix(spec_config, context: DrafterContext) -> Drafter:
    from .retrieval.suffix import SuffixConfig, SuffixDrafter

    opts = parse_options(SuffixOptions, spec_config.options)
    fields = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
    return SuffixDrafter(SuffixConfig(max_draft_len=spec_config.max_draft_len, **fields))


@declare_options(LayerSkipOptions)
def make_layer_skip(spec_config, context: DrafterContext) -> Drafter:
    from .layer_skip.drafter import LayerSkipConfig, LayerSkipDrafter

    opts = parse_options(LayerSkipOptions, spec_config.options)
    config = LayerSkipConfig(spec_config.max_draft_len, opts.skip_layers, opts.calibration_tokens)
    return LayerSkipDrafter(config, context.tokenizer)


@declare_options(LookaheadOptions)
def make_lookahead(spec_config, context: DrafterContext) -> Drafter:
    from .lookahead.drafter import LookaheadConfig, LookaheadDrafter

    opts = parse_options(LookaheadOptions, spec_config.options)
    fields = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
    return LookaheadDrafter(LookaheadConfig(max_draft_len=spec_config.max_draft_len, **fields))


@declare_options(RestOptions)
def make_rest(spec_config, context: DrafterContext) -> Drafter:
    from .retrieval.rest import RestConfig, RestDrafter

    opts = parse_options(RestOptions, spec_config.options)
    fields = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
    config = RestConfig(max_draft_len=spec_config.max_draft_len, **fields)
    return RestDrafter(config, context.tokenizer, context.vocab_size)


@declare_options(DraftTargetOptions)
def make_draft_target(spec_config, context: DrafterContext) -> Drafter:
    from .draft_target import DraftTargetDrafter, check_vocab_compatible

    opts = parse_options(DraftTargetOptions, spec_config.options)
    path = opts.speculative_model or opts.speculative_model_dir
    cfg = context.executor_config
    if path is None:
        if opts.quantization == "none":  # (the self-draft would be the target itself)
            raise ValueError("DraftTarget option quantization: a self-draft takes auto, int8, int4, gguf")
        draft = self_draft(context, "int8" if opts.quantization in (None, "auto") else opts.quantization)
    else:
        from ..executor.model.model_loader import load_model

        param = next(context.target_model.parameters())
        loaded = load_model(
            path,
            dtype=str(param.dtype).removeprefix("torch."),
            device=str(param.device),
            cache_dir=cfg.cache_dir,
            progress=cfg.progress,
            quantization=opts.quantization,
            model_impl=cfg.model_impl,
        )
        check_vocab_compatible(loaded.model, context.vocab_size, loaded.tokenizer, context.tokenizer)
        draft = loaded.model
    return DraftTargetDrafter(
        draft,
        spec_config.max_draft_len,
        context.vocab_size,
        sample_drafts=opts.sample_drafts,
        kv_cache_memory_gb=float(opts.kv_cache_memory_gb),
        block_size=cfg.block_size,
        max_num_tokens=cfg.max_num_tokens,
        model_impl=cfg.model_impl,
    )


def self_draft(context: DrafterContext, quantization: str):
    """The target at ``quantization``: loaded again from its file when the target's own layers are
    quantized already (the file has the weights before that), else a quantized copy of the target
    module (of its dequantized weights where it is quantized and was passed in as a module)."""
    from ..executor.model.model_loader import load_model
    from .quantize import has_quantized_layers, quantized_copy

    target = context.target_model
    dtype = self_draft_dtype(context, quantization)
    if context.target_path is None or not has_quantized_layers(target):
        return quantized_copy(target, quantization, context.target_path, getattr(torch, dtype))
    return load_model(
        context.target_path,
        dtype=dtype,
        device=str(next(target.parameters()).device),
        cache_dir=context.executor_config.cache_dir,
        quantization=quantization,
        progress=False,
        model_impl=context.executor_config.model_impl,
    ).model


def self_draft_dtype(context: DrafterContext, quantization: str) -> str:
    """The self-draft's dtype: the target's, except a float32 target's draft takes what ``dtype: auto``
    measures for the quantized weights (on the AVX512-BF16 machine the int8 kernel took ~10x longer
    with float32 activations than with bfloat16 ones, so a float32 draft would cost more than the
    target). The draft's dtype does not touch the output: the target verifies every token."""
    from ..executor.kernel_plan.dtype import choose_dtype
    from ..executor.layers.measurement.cache_folder import resolve_cache_dir

    param = next(context.target_model.parameters())
    dtype = str(param.dtype).removeprefix("torch.")
    if (kernel_dtype := cuda_kernel_dtype(param.device, param.dtype, quantization)) is not None:
        return kernel_dtype
    if param.dtype != torch.float32:
        return dtype
    shape = context.target_model.config.get_text_config().to_dict()
    config = context.executor_config
    return choose_dtype(
        param.device, shape, resolve_cache_dir(config.cache_dir), quantization, config.quantized_kernel
    ).dtype


def cuda_kernel_dtype(device: torch.device, dtype: torch.dtype, quantization: str) -> str | None:
    """On CUDA, for a target whose dtype ``quantization``'s kernels do not run in (a float64 target with
    int8 weights), the first dtype they do run in; else None. (On the CPU every dtype runs.)"""
    from ..executor.layers.quantized.quantized_linear import CUDA_KERNEL_DTYPES, kernel_scheme

    kernel_dtypes = CUDA_KERNEL_DTYPES.get(kernel_scheme(quantization))
    if device.type != "cuda" or kernel_dtypes is None or dtype in kernel_dtypes:
        return None
    return str(kernel_dtypes[0]).removeprefix("torch.")


@declare_options(Eagle3Options)
def make_eagle3(spec_config, context: DrafterContext) -> Drafter:
    from ..executor.kernel_plan.head_quantization import apply_head_quantization, choose_head_quantization
    from ..executor.layers.measurement.cache_folder import resolve_cache_dir
    from .eagle3.drafter import Eagle3Drafter
    from .eagle3.head import SHIPPED_HEAD, load_head

    opts = parse_options(Eagle3Options, spec_config.options)
    cfg = context.executor_config
    path = opts.speculative_model or opts.speculative_model_dir
    if path is None:
        if cfg.model is not None:
            raise ValueError(
                "Eagle needs speculative_model: an EAGLE-3 head directory for this target "
                "(the shipped head fits only the embedded SmolLM2-135M-Instruct)"
            )
        path = SHIPPED_HEAD
    target = context.target_model
    param = next(target.parameters())
    head = load_head(path, target.get_input_embeddings(), param.dtype, param.device)
    choice = choose_head_quantization(
        opts.head_quantization, head, param.device, resolve_cache_dir(cfg.cache_dir)
    )
    apply_head_quantization(head, choice)
    logger.info("EAGLE-3 head: %s", choice.reason)
    text_config = target.config.get_text_config()
    if head.config.target_hidden_size != text_config.hidden_size:
        raise ValueError(
            f"EAGLE-3 head {path} reads features of width {head.config.target_hidden_size}; "
            f"the target's hidden size is {text_config.hidden_size}"
        )
    drafter = Eagle3Drafter(
        head,
        spec_config.max_draft_len,
        context.vocab_size,
        text_config.num_hidden_layers,
        sample_drafts=opts.sample_drafts,
        kv_cache_memory_gb=float(opts.kv_cache_memory_gb),
        block_size=cfg.block_size,
        max_num_tokens=cfg.max_num_tokens,
        prompt_lookup=opts.prompt_lookup,
    )
    drafter.head_quantization = choice
    drafter.tree_growth = opts.tree_growth
    return drafter


@declare_options(UserProvidedOptions)
def make_user_provided(spec_config, context: DrafterContext) -> Drafter:
    """``drafter: "package.module:ClassName"`` with ``drafter_options: {...}`` for its constructor."""
    opts = parse_options(UserProvidedOptions, spec_config.options)
    return opts.drafter_class()(max_draft_len=spec_config.max_draft_len, **opts.drafter_options)


@hookimpl
def specexec_drafter_factories() -> dict:
    return {
        "NGram": make_ngram,
        "Suffix": make_suffix,
        "REST": make_rest,
        "DraftTarget": make_draft_target,
        "Eagle": make_eagle3,
        "Eagle3": make_eagle3,
        "LayerSkip": make_layer_skip,
        "Lookahead": make_lookahead,
        "Medusa": make_medusa,
        "UserProvided": make_user_provided,
    }
