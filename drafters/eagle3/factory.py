"""EAGLE-3's factory, registered by `drafters/builtin.py`: the head the options name (or the shipped
one), its weights quantized where this machine measured that faster."""

from __future__ import annotations

import logging

from ..base import Drafter, DrafterContext, declare_options
from .options import Eagle3Options

logger = logging.getLogger("specexec")


@declare_options(Eagle3Options)
def make(options: Eagle3Options, context: DrafterContext) -> Drafter:
    from ...executor.kernel_plan.head_quantization import apply_head_quantization, choose_head_quantization
    from ...executor.layers.measurement.cache_folder import resolve_cache_dir
    from .drafter import Eagle3Drafter
    from .head import SHIPPED_HEAD, load_head

    cfg = context.executor_config
    path = options.model_path
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
    choice = choose_head_quantization(
        options.head_quantization, head, param.device, resolve_cache_dir(cfg.cache_dir)
    )
    apply_head_quantization(head, choice)
    logger.info("EAGLE-3 head: %s", choice.reason)
    return Eagle3Drafter(
        head,
        context.max_draft_len,
        context.vocab_size,
        text_config.num_hidden_layers,
        sample_drafts=options.sample_drafts,
        kv_cache_memory_gb=float(options.kv_cache_memory_gb),
        block_size=cfg.block_size,
        max_num_tokens=cfg.max_num_tokens,
        prompt_lookup=options.prompt_lookup,
        head_quantization=choice,
        tree_growth=options.tree_growth,
    )
