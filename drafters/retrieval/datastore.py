"""REST's datastore: a text corpus as token ids of one tokenizer, in one ``.npz`` file.

`build_datastore` tokenizes documents (``specexec build-datastore`` feeds it files) and `save_datastore`
writes ``tokens`` (int32, every document one after another), ``offsets`` (int64, where each document
starts, then the end) and ``meta`` (JSON text: format, the tokenizer's fingerprint and vocabulary size,
the sources, counts). `load_datastore` refuses a file of another tokenizer: a token id means a piece of
text only under the vocabulary it was made with.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = "specexec-datastore-1"


class DatastoreError(ValueError):
    """A datastore file that cannot be read, or that was made for another tokenizer."""


def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 of the vocabulary (every token string and its id): equal exactly when ids mean the same
    text."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


@dataclass(slots=True)
class Datastore:
    tokens: np.ndarray  #: [num_tokens] int32, the documents one after another
    offsets: np.ndarray  #: [num_documents + 1] int64: document i is tokens[offsets[i]:offsets[i + 1]]
    meta: dict

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    def documents(self) -> Iterator[list[int]]:
        for start, end in zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist()):
            yield self.tokens[start:end].tolist()


def build_datastore(texts: Iterable[str], tokenizer, sources: list[str], progress=None) -> Datastore:
    """Tokenize each text (no special tokens added) into one datastore; empty texts are skipped.
    ``progress(num_documents, num_tokens)`` is called after each document."""
    pieces: list[np.ndarray] = []
    offsets = [0]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if ids:
            pieces.append(np.asarray(ids, dtype=np.int32))
            offsets.append(offsets[-1] + len(ids))
        if progress is not None:
            progress(len(pieces), offsets[-1])
    if not pieces:
        raise DatastoreError("the corpus holds no text: nothing to build a datastore from")
    vocab_size = len(tokenizer)
    meta = {
        "format": FORMAT,
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "vocab_size": vocab_size,
        "sources": sources,
        "num_documents": len(pieces),
        "num_tokens": offsets[-1],
    }
    return Datastore(np.concatenate(pieces), np.asarray(offsets, dtype=np.int64), meta)


def save_datastore(store: Datastore, path: str | Path) -> Path:
    """Write the datastore (``.npz`` is added to a name without it); returns the path written."""
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:  # whole or not at all: a reader never sees half a file
        np.savez(f, tokens=store.tokens, offsets=store.offsets, meta=np.array(json.dumps(store.meta)))
    partial.replace(path)
    return path


def load_datastore(path: str | Path, tokenizer=None, vocab_size: int | None = None) -> Datastore:
    """Read a datastore, checking it against the target's ``tokenizer`` (its fingerprint; a target
    without a tokenizer cannot be checked so) and ``vocab_size`` (every id below it)."""
    path = Path(path).expanduser()
    try:
        with np.load(path, allow_pickle=False) as data:
            tokens, offsets, meta = data["tokens"], data["offsets"], json.loads(str(data["meta"]))
    except (OSError, ValueError, KeyError) as exc:
        raise DatastoreError(f"cannot read datastore {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DatastoreError(
            f"{path} is not a specexec datastore ({FORMAT}); build one: specexec build-datastore"
        )
    if (
        offsets.ndim != 1
        or len(offsets) < 2
        or offsets[0] != 0
        or offsets[-1] != len(tokens)
        or np.any(np.diff(offsets) < 0)
    ):
        raise DatastoreError(f"datastore {path} is damaged: its document offsets do not fit its tokens")
    if tokenizer is not None and meta.get("tokenizer_fingerprint") != tokenizer_fingerprint(tokenizer):
        raise DatastoreError(
            f"datastore {path} was built with another tokenizer than the target's (sources: "
            f"{', '.join(meta.get('sources', [])) or '?'}); build it again with this model: "
            "specexec build-datastore --model <the target>"
        )
    if (
        vocab_size is not None
        and len(tokens)
        and not 0 <= int(tokens.min()) <= int(tokens.max()) < vocab_size
    ):
        raise DatastoreError(f"datastore {path} holds ids outside the target's vocabulary of {vocab_size}")
    return Datastore(tokens, offsets, meta)
