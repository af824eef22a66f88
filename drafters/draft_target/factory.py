"""DraftTarget's factory, registered by `drafters/builtin.py`: the draft model named by the options, or
the self-draft."""

from __future__ import annotations

from ..base import Drafter, DrafterContext, declare_options
from .options import DraftTargetOptions


@declare_options(DraftTargetOptions)
def make(options: DraftTargetOptions, context: DrafterContext) -> Drafter:
    from .drafter import DraftTargetDrafter, check_vocab_compatible
    from .self_draft import self_draft

    cfg = context.executor_config
    if options.model_path is None:
        draft = self_draft(
            context, "int8" if options.quantization in (None, "auto") else options.quantization
        )
    else:
        from ...executor.model.model_loader import load_model

        param = next(context.target_model.parameters())
        loaded = load_model(
            options.model_path,
            dtype=str(param.dtype).removeprefix("torch."),
            device=str(param.device),
            cache_dir=cfg.cache_dir,
            progress=cfg.progress,
            quantization=options.quantization,
            model_impl=cfg.model_impl,
        )
        check_vocab_compatible(loaded.model, context.vocab_size, loaded.tokenizer, context.tokenizer)
        draft = loaded.model
    return DraftTargetDrafter(
        draft,
        context.max_draft_len,
        context.vocab_size,
        sample_drafts=options.sample_drafts,
        kv_cache_memory_gb=float(options.kv_cache_memory_gb),
        block_size=cfg.block_size,
        max_num_tokens=cfg.max_num_tokens,
        model_impl=cfg.model_impl,
    )
