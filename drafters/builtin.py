"""The built-in drafters, registered with the plugin manager like any third-party plugin."""

from __future__ import annotations

import importlib
from typing import Any

from ..plugins import hookimpl
from .base import Drafter, DrafterContext


def _take_options(name: str, options: dict[str, Any], allowed: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown {name} option(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}"
        )
    return {**allowed, **options}


def make_ngram(spec_config, context: DrafterContext) -> Drafter:
    import dataclasses

    from .ngram import NGramConfig, NGramDrafter

    defaults = {f.name: f.default for f in dataclasses.fields(NGramConfig) if f.name != "max_draft_len"}
    options = _take_options("NGram", spec_config.options, defaults)
    return NGramDrafter(NGramConfig(max_draft_len=spec_config.max_draft_len, **options))


DRAFT_TARGET_OPTIONS = {
    "speculative_model": None,  #: draft model path (HF dir or GGUF); None = int8 copy of the target
    "speculative_model_dir": None,  #: trtllm-bench's name for the same
    "sample_drafts": False,  #: sample drafts and keep q (rejection sampling), else greedy drafts
    "kv_cache_memory_gb": 0.25,  #: the draft's KV pool
}


def make_draft_target(spec_config, context: DrafterContext) -> Drafter:
    from .draft_target import DraftTargetDrafter, check_vocab_compatible
    from .quantize import quantized_copy

    opts = _take_options("DraftTarget", spec_config.options, DRAFT_TARGET_OPTIONS)
    path = opts["speculative_model"] or opts["speculative_model_dir"]
    cfg = context.executor_config
    if path is None:
        draft = quantized_copy(context.target_model)
    else:
        from ..executor.model_loader import load_model

        loaded = load_model(path, dtype=cfg.dtype, device=str(next(context.target_model.parameters()).device))
        check_vocab_compatible(loaded.model, context.vocab_size, loaded.tokenizer, context.tokenizer)
        draft = loaded.model
    return DraftTargetDrafter(
        draft,
        spec_config.max_draft_len,
        context.vocab_size,
        sample_drafts=bool(opts["sample_drafts"]),
        kv_cache_memory_gb=float(opts["kv_cache_memory_gb"]),
        block_size=cfg.block_size,
        max_num_tokens=cfg.max_num_tokens,
    )


EAGLE3_OPTIONS = {
    "speculative_model": None,  #: head directory (published EAGLE-3 layout); None = the shipped SmolLM2 head
    "speculative_model_dir": None,  #: trtllm-bench's name for the same
    "sample_drafts": False,  #: sample drafts and keep q (rejection sampling), else greedy drafts
    "kv_cache_memory_gb": 0.25,  #: the head's KV pool
}


def make_eagle3(spec_config, context: DrafterContext) -> Drafter:
    from .eagle3 import Eagle3Drafter
    from .eagle3_head import SHIPPED_HEAD, load_head

    opts = _take_options("Eagle", spec_config.options, EAGLE3_OPTIONS)
    cfg = context.executor_config
    path = opts["speculative_model"] or opts["speculative_model_dir"]
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
    text_config = target.config.get_text_config()
    if head.config.target_hidden_size != text_config.hidden_size:
        raise ValueError(
            f"EAGLE-3 head {path} reads features of width {head.config.target_hidden_size}; "
            f"the target's hidden size is {text_config.hidden_size}"
        )
    return Eagle3Drafter(
        head,
        spec_config.max_draft_len,
        context.vocab_size,
        text_config.num_hidden_layers,
        sample_drafts=bool(opts["sample_drafts"]),
        kv_cache_memory_gb=float(opts["kv_cache_memory_gb"]),
        block_size=cfg.block_size,
        max_num_tokens=cfg.max_num_tokens,
    )


def make_user_provided(spec_config, context: DrafterContext) -> Drafter:
    """``drafter: "package.module:ClassName"`` with ``drafter_options: {...}`` for its constructor."""
    opts = _take_options("UserProvided", spec_config.options, {"drafter": None, "drafter_options": {}})
    target = opts["drafter"]
    if not isinstance(target, str) or ":" not in target:
        raise ValueError(f"UserProvided needs option drafter: 'package.module:ClassName', got {target!r}")
    module_name, _, class_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import drafter {target!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Drafter)):
        raise ValueError(f"{target!r} is not a subclass of specexec.drafters.Drafter")
    return cls(max_draft_len=spec_config.max_draft_len, **opts["drafter_options"])


@hookimpl
def specexec_drafter_factories() -> dict:
    return {
        "NGram": make_ngram,
        "DraftTarget": make_draft_target,
        "Eagle": make_eagle3,
        "Eagle3": make_eagle3,
        "UserProvided": make_user_provided,
    }
