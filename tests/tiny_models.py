"""Tiny randomly initialised Hugging Face models (and a tiny tokenizer) for the executor tests.

Nothing here is downloaded: every model is built from a config in memory. `make_tiny_model` returns
two models with identical weights: one to use as the Hugging Face reference and a deep copy for the
executor (the executor switches its copy's attention implementation, which mutates the config).
"""

from __future__ import annotations

import copy

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gemma3")
#: archs whose tiny config has a sliding window (prompt + generation must exceed it)
SLIDING_WINDOW = 8
SLIDING_ARCHS = ("mistral", "gemma3")
#: more archs, not in the main matrix: gemma2 exercises the attention-logit softcap path
EXTRA_ARCHS = ("gemma2",)

_COMMON = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
    # a wider init than the default 0.02 so greedy outputs depend on the context instead of
    # collapsing onto one token (and logits are far from ties)
    initializer_range=0.2,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    tie_word_embeddings=False,
)

_BUILDERS = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": SLIDING_WINDOW}),
    "gemma3": (
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        {
            "sliding_window": SLIDING_WINDOW,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
            "query_pre_attn_scalar": 8,
        },
    ),
    "gemma2": (
        Gemma2Config,
        Gemma2ForCausalLM,
        {
            "sliding_window": SLIDING_WINDOW,
            "query_pre_attn_scalar": 8,
            "attn_logit_softcapping": 5.0,
            "final_logit_softcapping": 3.0,
        },
    ),
}


def make_tiny_config(arch: str, **overrides):
    if arch not in _BUILDERS:
        raise ValueError(f"unknown arch {arch!r}; known: {', '.join(_BUILDERS)}")
    config_cls, _, extra = _BUILDERS[arch]
    kwargs = {**_COMMON, **extra, **overrides}
    if arch == "gemma3" and "num_hidden_layers" in overrides and "layer_types" not in overrides:
        pattern = extra["layer_types"]
        kwargs["layer_types"] = [pattern[i % len(pattern)] for i in range(overrides["num_hidden_layers"])]
    return config_cls(**kwargs)


def make_tiny_model(arch: str, dtype: torch.dtype = torch.float64, seed: int = 0, **overrides):
    """(reference model, executor copy): the same random weights, each with its own config."""
    config = make_tiny_config(arch, **overrides)
    model_cls = _BUILDERS[arch][1]
    torch.manual_seed(seed)
    model = model_cls(config).to(dtype).eval()
    model.requires_grad_(False)
    model.generation_config.bos_token_id = None
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model, copy.deepcopy(model)


def make_prompts(n: int, lengths, vocab_size: int = 256, seed: int = 0) -> list[list[int]]:
    """`n` random token-id prompts; `lengths` is one length or a sequence (cycled) of lengths."""
    if isinstance(lengths, int):
        lengths = [lengths]
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, vocab_size, (lengths[i % len(lengths)],), generator=gen).tolist() for i in range(n)
    ]


@torch.no_grad()
def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face `generate(do_sample=False)` output tokens (prompt excluded) for one prompt."""
    input_ids = torch.tensor([prompt])
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


# ---- a tiny word-level tokenizer ------------------------------------------------------------------------

#: chat template: one line per message, then the assistant tag when a generation prompt is asked for
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
SPECIAL_WORDS = ["<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]


def tiny_vocab(vocab_size: int = 256) -> dict[str, int]:
    words = SPECIAL_WORDS + [f"w{i}" for i in range(vocab_size - len(SPECIAL_WORDS))]
    return {w: i for i, w in enumerate(words)}


def make_tiny_tokenizer(vocab_size: int = 256) -> PreTrainedTokenizerFast:
    """Whitespace word-level tokenizer over ``<unk>``, chat tags and ``w0``, ``w1``, ...; no BOS/EOS;
    decoding joins words with spaces."""
    tok = Tokenizer(models.WordLevel(tiny_vocab(vocab_size), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with single spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", chat_template=CHAT_TEMPLATE)


def save_tiny_model_dir(path) -> str:
    """A float32 tiny Llama and the tiny tokenizer saved as an HF directory (a `--model` for the CLI)."""
    _, model = make_tiny_model("llama", dtype=torch.float32)
    model.save_pretrained(path)
    make_tiny_tokenizer().save_pretrained(path)
    return str(path)
