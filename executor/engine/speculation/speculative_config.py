"""The `speculative_config` block: the same keys as trtllm-bench's extra options YAML.

speculative_config:
  decoding_type: NGram          # NGram | Suffix | REST | Lookahead | LayerSkip | DraftTarget | Eagle | UserProvided | <plugin name>
  max_draft_len: 3
  max_matching_ngram_size: 3    # any other key is an option of that drafter
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..options import reject_unknown_keys
from .tree_config import check_draft_tree_value

DRAFT_LEN_POLICIES = ("fixed", "acceptance", "auto", "confidence")
#: vLLM's `speculative_config` keys -> the (TensorRT-LLM) keys specexec reads instead
VLLM_KEYS = {
    "method": "decoding_type (ngram -> NGram, draft_model -> DraftTarget, eagle3 -> Eagle)",
    "num_speculative_tokens": "max_draft_len",
    "model": "speculative_model",
    "prompt_lookup_max": "max_matching_ngram_size",
    "prompt_lookup_min": "max_matching_ngram_size (keys of every size up to it are tried)",
}


def _refuse_vllm_keys(data: dict[str, Any]) -> None:
    found = [k for k in VLLM_KEYS if k in data]
    if found:
        hints = "; ".join(f"{k!r} -> {VLLM_KEYS[k]}" for k in found)
        raise ValueError(
            f"speculative_config uses vLLM's key(s) {', '.join(map(repr, found))}; specexec reads "
            f"TensorRT-LLM's keys instead: {hints}"
        )


@reject_unknown_keys
@dataclass(slots=True)
class SpeculativeConfig:
    """Which drafter proposes tokens, and how many per step."""

    option_label = "speculative_config key"  #: (not a field) for the unknown-key error

    decoding_type: str  #: drafter name: NGram, Suffix, REST, Lookahead, LayerSkip, DraftTarget, Eagle, UserProvided, or a plugin's
    max_draft_len: int = 3  #: draft tokens per request per step, 1..32
    #: batch size -> draft length, e.g. {1: 4, 4: 2, 16: 0}; the largest key <= the running batch applies
    draft_len_schedule: dict[int, int] | None = None
    #: "fixed": k every step; "acceptance": per-request length from its running acceptance rate (shrink,
    #: stop below break-even, probe again); "auto" (the default): the same with this machine's measured
    #: forward cost curve;
    #: "confidence": each chain ends at the first draft whose drafter confidence does not pay for its
    #: cost on that curve (`executor/engine/speculation/confidence_stop.py`; drafters that report no confidence: "auto")
    draft_len_policy: str = "auto"
    #: drafts as a token tree (`tree_config.py`): true (the drafter's default shape), or a mapping of
    #: max_nodes and branching; max_draft_len is then the tree's depth
    draft_tree: bool | dict[str, int] | None = None
    options: dict[str, Any] = field(default_factory=dict)  #: the drafter's own options

    def __post_init__(self) -> None:
        if not isinstance(self.decoding_type, str) or not self.decoding_type:
            raise ValueError(
                f"speculative_config.decoding_type must be a drafter name, got {self.decoding_type!r}"
            )
        if (
            isinstance(self.max_draft_len, bool)
            or not isinstance(self.max_draft_len, int)
            or not 1 <= self.max_draft_len <= 32
        ):
            raise ValueError(
                f"speculative_config.max_draft_len must be an integer in 1..32, got {self.max_draft_len!r}"
            )
        schedule = self.draft_len_schedule
        if schedule is not None and not (
            isinstance(schedule, dict)
            and all(
                isinstance(k, int) and k >= 1 and isinstance(v, int) and 0 <= v <= self.max_draft_len
                for k, v in schedule.items()
            )
        ):
            raise ValueError(
                "speculative_config.draft_len_schedule must map batch sizes >= 1 to draft lengths "
                f"0..max_draft_len ({self.max_draft_len}), got {schedule!r}"
            )
        if self.draft_len_policy not in DRAFT_LEN_POLICIES:
            raise ValueError(
                f"speculative_config.draft_len_policy must be one of {', '.join(DRAFT_LEN_POLICIES)}, "
                f"got {self.draft_len_policy!r}"
            )
        check_draft_tree_value(self.draft_tree)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeculativeConfig:
        if not isinstance(data, dict):
            raise ValueError("speculative_config must be a mapping with at least 'decoding_type'")
        _refuse_vllm_keys(data)
        if "decoding_type" not in data:
            raise ValueError("speculative_config must be a mapping with at least 'decoding_type'")
        data = dict(data)
        own = {
            k: data.pop(k)
            for k in (
                "decoding_type",
                "max_draft_len",
                "draft_len_schedule",
                "draft_len_policy",
                "draft_tree",
            )
            if k in data
        }
        nested = data.pop("options", {})
        if not isinstance(nested, dict):
            raise ValueError(f"speculative_config.options must be a mapping, got {nested!r}")
        _refuse_vllm_keys(nested)
        return cls(**own, options={**nested, **data})

    def draft_len_for_batch(self, batch_size: int) -> int:
        if not self.draft_len_schedule:
            return self.max_draft_len
        keys = [k for k in self.draft_len_schedule if k <= batch_size]
        return self.draft_len_schedule[max(keys)] if keys else self.max_draft_len
