"""Medusa's factory, registered by `drafters/builtin.py`: the heads the options name (or the shipped ones)."""

from __future__ import annotations

from ..base import Drafter, DrafterContext, declare_options
from .heads import SHIPPED_HEADS, MedusaHeads, load_heads
from .options import MedusaOptions


def load_heads_for(opts: MedusaOptions, context) -> MedusaHeads:
    """The heads the options name (or the shipped ones, for the embedded model), in the target's dtype
    and on its device; heads of another width than the target's are refused."""
    path = opts.speculative_model or opts.speculative_model_dir
    if path is None:
        if context.executor_config.model is not None or not SHIPPED_HEADS.is_dir():
            shipped = (
                "; the shipped heads fit only the embedded SmolLM2-135M-Instruct"
                if SHIPPED_HEADS.is_dir()
                else ""
            )
            raise ValueError(
                "Medusa needs speculative_model: a heads directory for this target (train one with "
                f"`specexec train-medusa`){shipped}"
            )
        path = SHIPPED_HEADS
    param = next(context.target_model.parameters())
    heads = load_heads(path, param.dtype, param.device)
    width = context.target_model.config.get_text_config().hidden_size
    if heads.config.hidden_size != width:
        raise ValueError(
            f"Medusa heads {path} read hidden states of width {heads.config.hidden_size}; "
            f"the target's hidden size is {width}"
        )
    return heads


@declare_options(MedusaOptions)
def make(options: MedusaOptions, context: DrafterContext) -> Drafter:
    from .drafter import MedusaDrafter

    heads = load_heads_for(options, context)
    layers = context.target_model.config.get_text_config().num_hidden_layers
    return MedusaDrafter(heads, context.max_draft_len, context.vocab_size, layers)
