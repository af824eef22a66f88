"""A model's shape, read from its config.json or its GGUF header without loading any weights, so a
config can be checked (``max_model_len``) and a dtype chosen before the weights load."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from ..layers.quantized.gguf_index import MAX_NESTING
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
    (they follow the architecture's scalars and are most of the header). A hostile header raises
    ValueError or struct.error, which `peek_text_config` takes as "cannot tell": arrays nested deeper than
    `MAX_NESTING` are refused (5,000 deep overflowed the stack) and arrays of fixed-size values are
    stepped over whole, never element by element through a count the file could not hold."""
    size = path.stat().st_size
    with path.open("rb") as fh:

        def read(fmt: str):
            return struct.unpack("<" + fmt, fh.read(struct.calcsize("<" + fmt)))[0]

        def read_str() -> str:
            length = read("Q")
            if fh.tell() + length > size:
                raise ValueError(f"{path} is truncated: a string ends past the file's end")
            return fh.read(length).decode("utf-8", "replace")

        def skip(value_type: int, depth: int = 0) -> object:
            if value_type == 8:
                return read_str()
            if value_type == 9:
                item_type, count = read("I"), read("Q")
                if depth >= MAX_NESTING:
                    raise ValueError(f"{path}: metadata arrays nested more than {MAX_NESTING} deep")
                if item_type in _GGUF_SCALARS:
                    end = fh.tell() + count * struct.calcsize("<" + _GGUF_SCALARS[item_type])
                    if end > size:
                        raise ValueError(f"{path} is truncated: an array ends past the file's end")
                    fh.seek(end)
                    return None
                if fh.tell() + count * 8 > size:  # (a string or an array takes 8 bytes at least)
                    raise ValueError(f"{path} is truncated: {count} array elements cannot fit in it")
                for _ in range(count):
                    skip(item_type, depth + 1)
                return None
            if value_type not in _GGUF_SCALARS:
                raise ValueError(f"{path}: unknown metadata value type {value_type}")
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
