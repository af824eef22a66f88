"""Datastores for REST in the tests: of token ids (the tiny models have no tokenizer) or of text."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from specexec.drafters.retrieval.datastore import FORMAT, Datastore, build_datastore, save_datastore


def token_store(documents: list[list[int]]) -> Datastore:
    """A datastore of token ids, with no tokenizer's fingerprint (a target without one reads it)."""
    offsets = np.cumsum([0] + [len(d) for d in documents])
    meta = {"format": FORMAT, "tokenizer_fingerprint": None, "sources": ["test"]}
    return Datastore(np.concatenate([np.asarray(d, np.int32) for d in documents]), offsets, meta)


def token_datastore_file(documents: list[list[int]]) -> str:
    """`token_store` saved in a fresh temporary folder; returns its path."""
    return str(save_datastore(token_store(documents), Path(tempfile.mkdtemp()) / "store.npz"))


def text_datastore_file(texts: list[str], tokenizer) -> str:
    return str(
        save_datastore(build_datastore(texts, tokenizer, ["test"]), Path(tempfile.mkdtemp()) / "store.npz")
    )
