"""Medusa's factory (registered by `drafters/builtin.py`): its ``speculative_config`` keys, checked before
any model loads, and the heads they name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...executor.engine.options import parse_options, reject_unknown_keys
from ..base import Drafter, DrafterContext, declare_options
from .heads import SHIPPED_HEADS, MedusaHeads, load_heads


@reject_unknown_keys
@dataclass(slots=True)
class MedusaOptions:
    """``speculative_model`` is a Medusa heads directory (`specexec train-medusa`; None: the heads
    shipped for the embedded SmolLM2)."""

    option_label = "Medusa option"  #: (not a field) for the unknown-option error
    speculative_model: str | None = None  #: the heads directory
    speculative_model_dir: str | None = None  #: trtllm-bench's name for the same

    def __post_init__(self) -> None:
        for key in ("speculative_model", "speculative_model_dir"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not Path(value).expanduser().is_dir()):
                raise ValueError(f"{key}: {value!r} does not exist (a Medusa heads directory)")


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
def make_medusa(spec_config, context: DrafterContext) -> Drafter:
    from .drafter import MedusaDrafter

    heads = load_heads_for(parse_options(MedusaOptions, spec_config.options), context)
    layers = context.target_model.config.get_text_config().num_hidden_layers
    return MedusaDrafter(heads, spec_config.max_draft_len, context.vocab_size, layers)
