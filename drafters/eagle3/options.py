"""EAGLE-3's ``speculative_config`` keys, checked once when they are parsed."""

from __future__ import annotations

from dataclasses import dataclass

from ...executor.engine.options import reject_unknown_keys
from ..model_options import DraftModelOptions

#: ``tree_growth``: "dynamic" (EAGLE-2's tree, `dynamic_tree.py`: the head expands the best paths at each
#: depth) or "siblings" (its chain with the runners-up at each depth as leaves, `tree_siblings.py`)
TREE_GROWTHS = ("dynamic", "siblings")


@reject_unknown_keys
@dataclass(slots=True)
class Eagle3Options(DraftModelOptions):
    """``speculative_model`` is an EAGLE-3 head directory (None = the head shipped for the embedded
    SmolLM2)."""

    option_label = "Eagle option"  #: (not a field) for the unknown-option error
    #: the request's own text drafts where the head is unsure (prompt lookup; false: the head alone)
    prompt_lookup: bool = True
    #: the head's weights: auto (int8 where measured faster on this CPU), int8, or null (as loaded);
    #: see `executor/kernel_plan/head_quantization.py`
    head_quantization: str | None = "auto"
    tree_growth: str = "dynamic"  #: how ``draft_tree`` grows (`TREE_GROWTHS`)

    def __post_init__(self) -> None:
        from ...executor.kernel_plan.head_quantization import check_setting

        DraftModelOptions.__post_init__(self)
        if not isinstance(self.prompt_lookup, bool):
            raise ValueError(f"prompt_lookup must be true or false, got {self.prompt_lookup!r}")
        check_setting(self.head_quantization)
        if self.tree_growth not in TREE_GROWTHS:
            raise ValueError(
                f"tree_growth must be one of {', '.join(TREE_GROWTHS)}, got {self.tree_growth!r}"
            )
