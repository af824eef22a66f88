"""The one stop-token set every engine of a `specexec bench` run gets, and what ``--ignore-eos`` means.

Engines disagree on which tokens end a request: HF ``generate`` stops on the tokenizer's EOS, llama.cpp
on the GGUF's ``token_eos()``, specexec on the tokenizer's and the generation config's ids (Llama-3's
``<|eot_id|>`` is in the second, not the first). The bench takes the union once, records where each id
came from, and hands the same set to every engine: without ``--ignore-eos`` each stops on the first of
them; with it none of them can be sampled (`IGNORE_EOS_MEANING`), and every row counts the stop tokens
it sampled anyway, so the table shows that the definition held (0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: ``--ignore-eos`` in the bench, for every engine (the library's ``SamplingParams.ignore_eos`` samples
#: EOS and goes on, as vLLM's does; the bench's is stricter, as llama.cpp and OpenVINO GenAI do it)
IGNORE_EOS_MEANING = (
    "no token of the stop set can be sampled and every request runs to --max-tokens (HF and llama.cpp: "
    "their logits set to -inf; specexec and a server: min_tokens = max_tokens, which sets them to -inf)"
)
#: how each engine keeps the stop set out with --ignore-eos (each row records its own)
FORBIDDEN_BY = {
    "specexec": "min_tokens = max_tokens with the stop set as stop_token_ids (logits -inf)",
    "transformers": "suppress_tokens (logits -inf)",
    "llama.cpp": "logits processor (logits -inf)",
    "server": "min_tokens = max_tokens and the stop set as stop_token_ids in the request (vLLM's)",
    "llama-server": "ignore_eos in the request (llama.cpp: its end-of-generation tokens' logits -inf)",
}
#: GGUF metadata keys whose token ids end generation in llama.cpp (its EOS, end-of-turn, end-of-message)
GGUF_STOP_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


@dataclass(slots=True)
class StopTokens:
    """The stop set and where each of its ids came from (for the record)."""

    token_ids: list[int]  #: the union, sorted
    sources: dict[str, list[int]] = field(default_factory=dict)  #: "tokenizer" / "generation_config" / "gguf"

    def record(self, ignore_eos: bool) -> dict:
        """What the JSON record says about stopping."""
        return {
            "stop_token_ids": self.token_ids,
            "stop_token_sources": self.sources,
            "ignore_eos": ignore_eos,
            "ignore_eos_meaning": IGNORE_EOS_MEANING if ignore_eos else None,
        }


def _ids(value) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    return []


def gguf_stop_ids(path: Path) -> list[int]:
    """The ids llama.cpp stops on, as the file's metadata names them (EOS, EOT, EOM where present)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    ids = []
    for key in GGUF_STOP_KEYS:
        found = reader.fields.get(key)
        if found is not None:
            ids.append(int(found.parts[found.data[0]][0]))
    return ids


def find_stop_tokens(tokenizer, generation_config, gguf_path: Path | None = None) -> StopTokens:
    """The union of the tokenizer's EOS, the generation config's EOS ids and, for a GGUF model, the
    file's own stop ids."""
    sources = {
        "tokenizer": _ids(getattr(tokenizer, "eos_token_id", None)),
        "generation_config": _ids(getattr(generation_config, "eos_token_id", None)),
    }
    if gguf_path is not None:
        sources["gguf"] = gguf_stop_ids(gguf_path)
    union = sorted({t for ids in sources.values() for t in ids})
    return StopTokens(union, sources)


def num_stop_tokens(token_ids: list[int], stop_token_ids: list[int]) -> int:
    """How many of the output's tokens are in the stop set."""
    stops = set(stop_token_ids)
    return sum(t in stops for t in token_ids)
