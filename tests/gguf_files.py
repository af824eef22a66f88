"""Tiny random GGUF files of the families people run, written by the tests (no downloads).

`write_gguf` builds a tiny random transformers model of a family and writes it the way llama.cpp's
``convert_hf_to_gguf.py`` does: every tensor F32 under llama.cpp's name (``gguf.get_tensor_name_map``,
the map transformers reads it back with), with the converter's own changes -- the ``llama``
architecture's q/k rows permuted for llama.cpp's rotary layout, Gemma's norm weights stored as
``1 + w``, Llama 3's rope scaling as a ``rope_freqs`` tensor -- and the converter's metadata: shape,
rope, sliding window, soft-capping, the vocabulary (`gguf_vocabs.py`), its special ids and chat template.
The source model comes back with the file: what the file must load as.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf_vocabs import (
    CHATML_TEMPLATE,
    GEMMA_TEMPLATE,
    LLAMA3_TEMPLATE,
    MISTRAL_TEMPLATE,
    Vocab,
    bpe_vocab,
    spm_vocab,
)
from tiny_models import make_tiny_model

#: Llama 3.1's rope scaling (3.2 and 3.3 differ only in `factor`)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
#: Gemma 3 4B-27B: linear scaling on the global layers only, local layers at base 10000
GEMMA3_ROPE = {
    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
}


@dataclass(frozen=True, slots=True)
class Family:
    """One kind of GGUF file: the source model, the file's architecture, vocabulary and special tokens."""

    arch: str  #: `tiny_models` arch of the source model
    gguf_arch: str  #: ``general.architecture``
    name: str  #: ``general.name`` (transformers reads "mistral" out of it)
    vocab_kind: str  #: "bpe" or "spm" (`gguf_vocabs.py`)
    control_tokens: tuple[str, ...]
    special: dict[str, str]  #: ``tokenizer.ggml.<key>_token_id`` -> token: bos, eos, eot, eom, pad, unk
    add_bos: bool  #: ``tokenizer.ggml.add_bos_token``
    chat_template: str
    config: dict = field(default_factory=dict)  #: source config overrides
    pre: str | None = None  #: byte-level BPE's pre-tokenizer name

    def vocab(self) -> Vocab:
        if self.vocab_kind == "bpe":
            return bpe_vocab(self.control_tokens, self.pre or "default")
        return spm_vocab(self.control_tokens)


#: Llama 3.1: EOS <|end_of_text|>, the end of a turn <|eot_id|> and of a message <|eom_id|> named apart
LLAMA3 = Family(
    arch="llama",
    gguf_arch="llama",
    name="Meta Llama 3.1 8B Instruct",
    vocab_kind="bpe",
    pre="llama-bpe",
    control_tokens=(
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
    ),
    special={"bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "eot": "<|eot_id|>", "eom": "<|eom_id|>"},
    add_bos=True,
    chat_template=LLAMA3_TEMPLATE,
    config={"rope_parameters": LLAMA3_ROPE, "max_position_embeddings": 131072},
)
#: Qwen2.5 7B: q/k/v biases, its own head
QWEN2 = Family(
    arch="qwen2",
    gguf_arch="qwen2",
    name="Qwen2.5 7B Instruct",
    vocab_kind="bpe",
    pre="qwen2",
    control_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    special={"bos": "<|endoftext|>", "eos": "<|im_end|>", "pad": "<|endoftext|>"},
    add_bos=False,
    chat_template=CHATML_TEMPLATE,
)
#: Mistral 7B's sentencepiece vocabulary, with Nemo's head_dim that is not hidden / heads; llama.cpp
#: writes Mistral as the ``llama`` architecture, with no sliding window
MISTRAL = Family(
    arch="mistral",
    gguf_arch="llama",
    name="Mistral 7B Instruct v0.3",
    vocab_kind="spm",
    control_tokens=("<unk>", "<s>", "</s>", "[INST]", "[/INST]"),
    special={"bos": "<s>", "eos": "</s>", "unk": "<unk>"},
    add_bos=True,
    chat_template=MISTRAL_TEMPLATE,
    config={"sliding_window": None, "head_dim": 16},
)
#: Gemma 2: the head tied, a sliding window on every other layer, attention and final soft-capping
GEMMA2 = Family(
    arch="gemma2",
    gguf_arch="gemma2",
    name="Gemma 2 9b It",
    vocab_kind="spm",
    control_tokens=("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
    special={"bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "pad": "<pad>"},
    add_bos=True,
    chat_template=GEMMA_TEMPLATE,
    config={"tie_word_embeddings": True},
)
FAMILIES = {
    "llama3": LLAMA3,
    "qwen2": QWEN2,
    # Qwen2.5 0.5B-3B: the head tied to the embedding (no ``output`` tensor in the file)
    "qwen2-tied": replace(QWEN2, name="Qwen2.5 0.5B Instruct", config={"tie_word_embeddings": True}),
    "mistral": MISTRAL,
    "gemma2": GEMMA2,
    # Gemma 3: q/k norms, five sliding layers to one global (llama.cpp's fixed pattern), linear rope
    # scaling on the global ones
    "gemma3": replace(
        GEMMA2,
        arch="gemma3",
        gguf_arch="gemma3",
        name="Gemma 3 4b It",
        config={"num_hidden_layers": 6, "rope_parameters": GEMMA3_ROPE, "tie_word_embeddings": True},
    ),
}


def make_source_model(family: Family, seed: int = 0):
    """The tiny float32 model a family's file is written from (2 layers unless the family says)."""
    overrides = {"vocab_size": len(family.vocab()), "num_hidden_layers": 2, **family.config}
    if family.arch == "gemma3":
        n = overrides["num_hidden_layers"]
        overrides["layer_types"] = ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(n)]
    model, _ = make_tiny_model(family.arch, dtype=torch.float32, seed=seed, **overrides)
    return model


def write_gguf(path: Path, family_name: str, model=None):
    """Write ``family_name``'s file at ``path`` from ``model`` (default: `make_source_model`); returns
    (the model, its vocabulary)."""
    family = FAMILIES[family_name]
    model = make_source_model(family) if model is None else model
    vocab = family.vocab()
    writer = gguf.GGUFWriter(str(path), family.gguf_arch)
    writer.add_name(family.name)
    _add_hparams(writer, family, model.config)
    _add_vocab(writer, family, vocab)
    for name, tensor in _gguf_tensors(family, model):
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, vocab


def _add_hparams(writer: gguf.GGUFWriter, family: Family, config) -> None:
    """The converter's ``set_gguf_parameters`` for these families."""
    head_dim = config.head_dim
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    rope = config.rope_parameters
    if family.gguf_arch == "gemma3":
        rope = rope["full_attention"]
        if rope["rope_type"] == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope["factor"])
    writer.add_rope_freq_base(rope["rope_theta"])
    if family.gguf_arch == "llama":
        writer.add_vocab_size(config.vocab_size)
        writer.add_rope_dimension_count(head_dim)
    if family.gguf_arch.startswith("gemma"):
        writer.add_sliding_window(config.sliding_window)
    if family.gguf_arch == "gemma2":
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        writer.add_final_logit_softcapping(config.final_logit_softcapping)


def _add_vocab(writer: gguf.GGUFWriter, family: Family, vocab: Vocab) -> None:
    writer.add_tokenizer_model(vocab.model)
    if vocab.pre is not None:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    if vocab.scores:
        writer.add_token_scores(vocab.scores)
    for key, token in family.special.items():
        writer.add_uint32(f"tokenizer.ggml.{key}_token_id", vocab.id(token))
    writer.add_add_bos_token(family.add_bos)
    writer.add_chat_template(family.chat_template)


def _gguf_tensors(family: Family, model):
    """(llama.cpp name, float32 array) for each of the model's tensors, as the converter writes them."""
    config = model.config
    names = gguf.get_tensor_name_map(_arch_enum(family.gguf_arch), config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # tied: the file has no ``output``
        base, suffix = hf_name.rsplit(".", 1)
        name = names.get_name(base)
        assert name is not None, f"no llama.cpp name for {hf_name}"
        data = tensor.detach().to(torch.float32)
        if family.gguf_arch == "llama" and base.endswith(("q_proj", "k_proj")):
            heads = config.num_attention_heads if base.endswith("q_proj") else config.num_key_value_heads
            data = _permute_for_llama_cpp(data, heads)
        if family.gguf_arch.startswith("gemma") and base.endswith("norm"):
            data = data + 1  # llama.cpp's Gemma norms multiply by w, transformers' by (1 + w)
        yield f"{name}.{suffix}", data.numpy()
    if config.rope_parameters.get("rope_type") == "llama3":
        yield "rope_freqs.weight", _llama3_rope_factors(config)


def _arch_enum(gguf_arch: str) -> gguf.MODEL_ARCH:
    return next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == gguf_arch)


def _permute_for_llama_cpp(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """The converter's ``LlamaModel.permute``: each head's rows from half-split to interleaved pairs."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _llama3_rope_factors(config) -> np.ndarray:
    """The converter's ``rope_freqs`` for a ``llama3`` rope: what each frequency is divided by."""
    rope, dim = config.rope_parameters, config.head_dim
    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    old_len = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / rope["low_freq_factor"], old_len / rope["high_freq_factor"]
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(rope["factor"])
        else:
            smooth = (old_len / wavelen - rope["low_freq_factor"]) / (
                rope["high_freq_factor"] - rope["low_freq_factor"]
            )
            factors.append(1 / ((1 - smooth) / rope["factor"] + smooth))
    return np.array(factors, dtype=np.float32)
