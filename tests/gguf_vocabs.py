"""Tiny GGUF vocabularies, written the way llama.cpp's converter writes real ones (no downloads).

Two kinds, as the families use them:

- ``bpe``: byte-level BPE (``tokenizer.ggml.model = "gpt2"``; Llama 3, Qwen2, Mistral Nemo): the 256
  byte symbols in GPT-2's printable spelling, a few merges, then the control tokens.
- ``spm``: sentencepiece (``tokenizer.ggml.model = "llama"``; Gemma 2/3, Mistral 7B): control tokens,
  the 256 ``<0xNN>`` byte-fallback pieces, then a few ``▁``-spelled pieces with falling scores.

Either encodes any text, the loader's round-trip probe included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers.convert_slow_tokenizer import bytes_to_unicode

#: llama.cpp's token types (``gguf.TokenType``)
NORMAL, CONTROL, BYTE = 1, 3, 6

#: byte-level merges, in priority order: they build "Hello", " world", " spaces" and " tab"
BPE_MERGES = ("H e", "l l", "He ll", "Hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "Ġ t", "a b", "Ġt ab")
#: sentencepiece pieces beyond the bytes, best first (the merges are rebuilt from this order)
SPM_PIECES = (
    "▁",
    "H",
    "e",
    "l",
    "o",
    "w",
    "r",
    "d",
    "He",
    "ll",
    "Hell",
    "Hello",
    "▁w",
    "or",
    "▁wor",
    "ld",
    "▁world",
)


@dataclass(slots=True)
class Vocab:
    """What goes under ``tokenizer.ggml.*``: the tokens with their types, and the ids to name."""

    model: str  #: "gpt2" or "llama"
    pre: str | None  #: the pre-tokenizer's name (``tokenizer.ggml.pre``), byte-level BPE only
    tokens: list[str]
    token_types: list[int]
    merges: list[str] = field(default_factory=list)  #: "left right" pairs, BPE only
    scores: list[float] = field(default_factory=list)  #: one per token, sentencepiece only

    def id(self, token: str) -> int:
        return self.tokens.index(token)

    def __len__(self) -> int:
        return len(self.tokens)


def bpe_vocab(control_tokens: tuple[str, ...], pre: str) -> Vocab:
    spelled = bytes_to_unicode()
    tokens = [spelled[b] for b in range(256)] + [m.replace(" ", "") for m in BPE_MERGES]
    types = [NORMAL] * len(tokens) + [CONTROL] * len(control_tokens)
    return Vocab("gpt2", pre, tokens + list(control_tokens), types, merges=list(BPE_MERGES))


def spm_vocab(control_tokens: tuple[str, ...]) -> Vocab:
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    tokens = list(control_tokens) + byte_pieces + list(SPM_PIECES)
    types = [CONTROL] * len(control_tokens) + [BYTE] * 256 + [NORMAL] * len(SPM_PIECES)
    scores = [0.0] * (len(control_tokens) + 256) + [-float(i) for i in range(len(SPM_PIECES))]
    return Vocab("llama", None, tokens, types, scores=scores)


# ---- the families' chat templates (short, in each family's own format) ----------------------------------

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
