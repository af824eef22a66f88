"""A model's shape, read from its config.json or its GGUF header without loading any weights, so a
config can be checked (``max_model_len``) and a dtype chosen before the weights load."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from .model_loader import ModelLoadError, default_model_path

#: GGUF ``<arch>.<key>`` -> the transformers config key it fills
_GGUF_KEYS = {
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "block_count": "num_hidden_layers",
    "vocab_size": "vocab_size",
}
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def peek_text_config(model: str | os.PathLike | None) -> dict:
    """The text model's config keys (``hidden_size``, ``num_hidden_layers``, ...) that the source holds;
    {} when it cannot tell (the load itself reports what is wrong)."""
    try:
        path = default_model_path() if model is None else Path(model).expanduser()
        if path.is_dir():
            config = json.loads((path / "config.json").read_text())
            return {**config, **config.get("text_config", {})}
        if path.is_file():
            return _gguf_text_config(path)
    except (OSError, ValueError, AttributeError, struct.error, ModelLoadError):
        pass
    return {}


def peek_max_position_embeddings(model: str | os.PathLike | None) -> int | None:
    """The model's longest context (so a bad ``max_model_len`` is refused before loading); None when
    it cannot tell."""
    value = peek_text_config(model).get("max_position_embeddings")
    return int(value) if value else None


def _gguf_text_config(path: Path) -> dict:
    """The architecture's keys from a GGUF file's key-value header, read up to the tokenizer's arrays
    (they follow the architecture's scalars and are most of the header)."""
    with path.open("rb") as fh:

        def read(fmt: str):
            return struct.unpack("<" + fmt, fh.read(struct.calcsize("<" + fmt)))[0]

        def read_str() -> str:
            return fh.read(read("Q")).decode("utf-8", "replace")

        def skip(value_type: int) -> object:
            if value_type == 8:
                return read_str()
            if value_type == 9:
                item_type, count = read("I"), read("Q")
                for _ in range(count):
                    skip(item_type)
                return None
            return read(_GGUF_SCALARS[value_type])

        if fh.read(4) != b"GGUF" or read("I") < 2:
            return {}
        read("Q")  # tensor count
        arch, config = None, {}
        for _ in range(read("Q")):
            key = read_str()
            if key.startswith("tokenizer.") and config:
                break
            value = skip(read("I"))
            if key == "general.architecture":
                arch = value
            elif arch is not None and key.startswith(f"{arch}.") and key[len(arch) + 1 :] in _GGUF_KEYS:
                config[_GGUF_KEYS[key[len(arch) + 1 :]]] = value
        return config
