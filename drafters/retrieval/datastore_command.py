"""``specexec build-datastore``: tokenize a text corpus for REST drafting (`rest.py`).

Inputs are ``.jsonl`` files (per record, the ``--field`` value: a string, or a list of strings or of
chat messages, each ``content`` a document) and any other UTF-8 text files (``.txt``, source code: each
one document).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs", nargs="+", help=".jsonl files, or text files (.txt, source code: one document each)"
    )
    parser.add_argument("--output", required=True, help="the datastore file to write (.npz)")
    parser.add_argument(
        "--model",
        help="the target whose tokenizer to use: HF directory or GGUF file (default: the embedded model)",
    )
    parser.add_argument(
        "--field", default="text", help="the .jsonl records' field holding the text (default text)"
    )


def load_tokenizer(model: str | None):
    """The target's tokenizer alone (no weights): from an HF directory or a GGUF file."""
    from transformers import AutoTokenizer

    from ...executor.model.model_loader import default_model_path

    path = Path(model).expanduser() if model else default_model_path()
    if not path.exists():
        raise ValueError(f"--model {path} does not exist")
    try:
        if path.is_file():
            return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise ValueError(f"cannot load the tokenizer of {path}: {type(exc).__name__}: {exc}") from exc


def _texts_of(value, where: str) -> Iterator[str]:
    from .datastore import DatastoreError

    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            text = item.get("content") if isinstance(item, dict) else item
            if not isinstance(text, str):
                raise DatastoreError(f"{where}: a list item is neither text nor a message with text content")
            yield text
    else:
        raise DatastoreError(f"{where}: the field is {type(value).__name__}, not text or a list of texts")


def read_texts(paths: list[Path], field: str) -> Iterator[str]:
    """Every document of the inputs, in order."""
    from .datastore import DatastoreError

    for path in paths:
        if path.suffix == ".jsonl":
            with open(path, encoding="utf-8") as f:
                for line_number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    where = f"{path}:{line_number}"
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise DatastoreError(f"{where}: not JSON ({exc})") from exc
                    if not isinstance(record, dict) or field not in record:
                        raise DatastoreError(f"{where}: no field {field!r} (choose it with --field)")
                    yield from _texts_of(record[field], where)
        else:
            try:
                yield path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise DatastoreError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def run(args: argparse.Namespace) -> int:
    from .datastore import build_datastore, save_datastore

    paths = [Path(p).expanduser() for p in args.inputs]
    for path in paths:
        if not path.is_file():
            raise ValueError(f"input {path} is not a file")
    tokenizer = load_tokenizer(args.model)

    def progress(num_documents: int, num_tokens: int) -> None:
        if num_documents % 1000 == 0:
            print(f"\r{num_documents} documents, {num_tokens} tokens", end="", file=sys.stderr)

    store = build_datastore(read_texts(paths, args.field), tokenizer, [str(p) for p in paths], progress)
    written = save_datastore(store, args.output)
    print(
        f"\rwrote {written}: {store.num_documents} documents, {len(store.tokens)} tokens "
        f"({written.stat().st_size / 2**20:.1f} MiB)",
        file=sys.stderr,
    )
    return 0
