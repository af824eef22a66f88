"""What a GGUF file says that transformers' GGUF conversion drops, read the way llama.cpp reads it.

transformers rebuilds a config and a tokenizer from the file's metadata but keeps only part of it. For
the families specexec's decoder runs, this is what llama.cpp does with the rest, and what the model
would do without it:

| the file's                                       | llama.cpp                           | transformers alone       |
|--------------------------------------------------|-------------------------------------|--------------------------|
| eos, eot, eom, fim pad/rep/sep ids, and tokens   | ends generation on any of them      | stops on EOS only        |
| named ``<|eot_id|>``, ``<|im_end|>``, ...        | (``llama_vocab::is_eog``)           |                          |
| ``rope_freqs`` tensor (Llama 3.1+)               | divides each rotary frequency by it | plain rope               |
| ``<arch>.rope.scaling.type`` linear, ``.factor`` | scales positions (Gemma 3: global   | ignored                  |
|                                                  | layers only)                        |                          |
| ``gemma2.*_logit_softcapping``                   | applied                             | the class defaults       |
| Gemma's attention scale (not in the file)        | 1/sqrt(head_dim); the 27B models    | query_pre_attn_scalar    |
|                                                  | 1/sqrt(hidden / heads)              | 256 whatever the model   |

`apply_llama_cpp_config_inplace` sets the config rows before the model is built; the end-of-generation
ids go to the generation config, which the engine stops on (`engine_setup._eos_token_ids`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

logger = logging.getLogger("specexec")

#: metadata keys whose token ids end generation in llama.cpp
EOG_ID_KEYS = tuple(
    f"tokenizer.ggml.{name}_token_id" for name in ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")
)
#: tokens llama.cpp ends generation on by their text, whatever the metadata names (llama-vocab.cpp)
EOG_TOKENS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
    }
)
#: Llama 3.1's rope scaling less its factor (3.2 and 3.3 differ only in the factor): the ``rope_freqs``
#: a file holds are matched against these
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
#: llama.cpp's layer counts of the Gemma 27B models, whose attention scale is 1/sqrt(hidden / heads)
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


@dataclass(slots=True)
class GGUFMetadata:
    """The parts of a GGUF file's header read here."""

    arch: str  #: ``general.architecture``
    values: dict[str, int | float | str]  #: every scalar and string field, by key
    tokens: list[str]  #: ``tokenizer.ggml.tokens``
    rope_freqs: np.ndarray | None  #: [head_dim / 2] the ``rope_freqs`` tensor, where the file has one

    @classmethod
    def read(cls, path: Path) -> GGUFMetadata:
        import gguf

        reader = gguf.GGUFReader(str(path))
        values: dict[str, int | float | str] = {}
        tokens: list[str] = []
        for key, field in reader.fields.items():
            kind = field.types[0] if field.types else None
            if key == "tokenizer.ggml.tokens":
                tokens = [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
            elif kind == gguf.GGUFValueType.STRING:
                values[key] = bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
            elif kind is not None and kind != gguf.GGUFValueType.ARRAY:
                values[key] = field.parts[field.data[0]][0].item()
        freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
        rope_freqs = None if freqs is None else np.array(freqs.data, dtype=np.float32).reshape(-1)
        return cls(str(values.get("general.architecture", "")), values, tokens, rope_freqs)


def end_of_generation_ids(meta: GGUFMetadata) -> list[int]:
    """The ids llama.cpp ends generation on: the file's EOS first, then the others in id order."""
    ids = {int(meta.values[key]) for key in EOG_ID_KEYS if key in meta.values}
    ids |= {i for i, token in enumerate(meta.tokens) if token in EOG_TOKENS}
    ids = {i for i in ids if 0 <= i < len(meta.tokens)}
    eos = meta.values.get("tokenizer.ggml.eos_token_id")
    first = [int(eos)] if eos is not None and int(eos) in ids else []
    return first + sorted(ids - set(first))


def apply_llama_cpp_config_inplace(config, meta: GGUFMetadata) -> list[str]:
    """Set in ``config`` (from transformers' GGUF loading) what llama.cpp reads from the file and
    transformers drops; one line per change. ``ValueError`` for rope frequencies it cannot express."""
    changes = []
    if meta.rope_freqs is not None:
        config.rope_parameters = _llama3_rope(config, meta.rope_freqs)
        changes.append(f"llama3 rope scaling (factor {config.rope_parameters['factor']:g}) from rope_freqs")
    scaling = meta.values.get(f"{meta.arch}.rope.scaling.type")
    factor = float(meta.values.get(f"{meta.arch}.rope.scaling.factor", 1.0))
    if scaling == "linear" and factor != 1.0:
        _set_linear_rope_inplace(config, factor)
        changes.append(f"linear rope scaling, factor {factor:g}")
    elif scaling not in (None, "none", "linear"):
        logger.warning(
            "the GGUF's rope scaling %r (factor %g) is not applied (transformers drops it and specexec maps "
            "only linear scaling and Llama 3's rope_freqs): outputs will differ from llama.cpp's",
            scaling,
            factor,
        )
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = meta.values.get(f"{meta.arch}.{name}")
        if value is not None and hasattr(config, name) and getattr(config, name) != value:
            setattr(config, name, float(value))
            changes.append(f"{name} {value:g}")
    if meta.arch in GEMMA_27B_LAYERS and hasattr(config, "query_pre_attn_scalar"):
        scalar = _gemma_query_scalar(config, meta.arch)
        if config.query_pre_attn_scalar != scalar:
            config.query_pre_attn_scalar = scalar
            changes.append(f"query_pre_attn_scalar {scalar} (llama.cpp's Gemma attention scale)")
    return changes


def _llama3_rope(config, rope_freqs: np.ndarray) -> dict:
    """The ``llama3`` rope parameters whose per-frequency factors are the file's ``rope_freqs`` (what
    llama.cpp's converter writes for them), or ``ValueError``."""
    theta = float(_flat_rope(config)["rope_theta"])
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    params = {"rope_type": "llama3", "rope_theta": theta, "factor": float(rope_freqs.max()), **LLAMA3_ROPE}
    want = _llama3_factors(params, head_dim)
    if want.shape != rope_freqs.shape or not np.allclose(want, rope_freqs, rtol=1e-5, atol=0):
        raise ValueError(
            f"its rope_freqs tensor ({rope_freqs.size} factors, largest {rope_freqs.max():g}) is not Llama 3's "
            f"rope scaling ({LLAMA3_ROPE}), the only per-frequency factors transformers can run"
        )
    return params


def _llama3_factors(params: dict, head_dim: int) -> np.ndarray:
    """[head_dim / 2] what llama.cpp's converter writes as ``rope_freqs`` for a ``llama3`` rope."""
    freqs = 1.0 / (params["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    old_len, factor = params["original_max_position_embeddings"], params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    wavelen = 2 * math.pi / freqs
    smooth = (old_len / wavelen - low) / (high - low)
    between = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old_len / high, 1.0, np.where(wavelen > old_len / low, factor, between))


def _flat_rope(config) -> dict:
    """The rope parameters of the layers a GGUF's rope keys describe (Gemma 3: the global ones)."""
    rope = config.rope_parameters
    return rope.get("full_attention", rope)


def _set_linear_rope_inplace(config, factor: float) -> None:
    rope = dict(config.rope_parameters)
    # Gemma 3: llama.cpp scales only the global layers (``rope_freq_scale_train_swa = 1``)
    if "full_attention" in rope:
        rope["full_attention"] = {**rope["full_attention"], "rope_type": "linear", "factor": factor}
    else:
        rope = {**rope, "rope_type": "linear", "factor": factor}
    config.rope_parameters = rope


def _gemma_query_scalar(config, arch: str) -> int:
    if config.num_hidden_layers == GEMMA_27B_LAYERS[arch]:
        return config.hidden_size // config.num_attention_heads
    return config.head_dim
