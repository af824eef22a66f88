"""The durable part of a training corpus: the target's answers as token ids, and the self-instruct pool
(`specexec train-eagle3`'s), in append-only gzip shards small enough to commit (a few bytes per token).

The features (the hidden states `corpus.generate_corpus` saves: about 4 KiB per position for EAGLE-3)
live only in ``<output>/corpus``, which a fresh machine does not have. From the archive it rebuilds them
with one prefill pass of the target over each archived sequence (`corpus.generate_corpus` does that before
answering anything new): batched prefill costs a small fraction of generating the same answers token by
token, so the hours spent answering are spent once. Each export writes only what the archive does not
hold yet, to a new shard, so earlier shards never change. An archive belongs to one target:
``archive.json`` holds its fingerprint, and a target with another fingerprint is refused. The archive
bundled for the default model is in ``data/``; `specexec train-medusa` prefills its greedy answers.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .jsonl import open_for_append, read_jsonl

ARCHIVE_FILE = "archive.json"
#: the archive of the default model's answers, bundled with the package
BUNDLED_ARCHIVE = Path(__file__).parent / "data" / "smollm2-135m-instruct"
#: the fields of an answer the archive keeps (the rest of a corpus record is rebuilt)
ANSWER_FIELDS = ("id", "prompt_token_ids", "output_token_ids")
_SHARD = re.compile(r"^(answers|pool)-(\d{4,})\.jsonl\.gz$")


def target_fingerprint(model) -> str:
    """What tells one target's answers from another's: its config's shapes and a hash of its first
    embedding rows, rounded to bfloat16 (a float32 and a bfloat16 copy of one model agree)."""
    tc = model.config.get_text_config()
    rows = model.get_input_embeddings().weight[:16].detach().to("cpu", torch.float32).to(torch.bfloat16)
    digest = hashlib.sha256(rows.view(torch.int16).numpy().tobytes()).hexdigest()[:16]
    return f"{tc.model_type}-h{tc.hidden_size}-l{tc.num_hidden_layers}-v{tc.vocab_size}-{digest}"


@dataclass(slots=True)
class CorpusArchive:
    """The shards in ``root``: ``answers-NNNN.jsonl.gz`` (`ANSWER_FIELDS` per line) and
    ``pool-NNNN.jsonl.gz`` (self-instruct records, `drafters/eagle3/training/prompts.py: read_pool`'s
    fields)."""

    root: Path

    def check_target(self, fingerprint: str) -> None:
        """Claim an empty archive for this target, or refuse one that holds another target's answers."""
        meta = self.root / ARCHIVE_FILE
        if meta.exists():
            held = json.loads(meta.read_text())["target"]
            if held != fingerprint:
                raise ValueError(
                    f"--archive {self.root} holds the answers of another target ({held}; this one is "
                    f"{fingerprint}): pass another --archive, or --archive none"
                )
            return
        self.root.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps({"target": fingerprint}, indent=1) + "\n")

    def answers(self) -> list[dict]:
        """Every archived answer, in shard order."""
        return self._read("answers")

    def instructions(self) -> list[dict]:
        """Every archived self-instruct record, in shard order."""
        return self._read("pool")

    def restore_pool(self, path: Path) -> int:
        """Append the archived instructions that the pool file ``path`` lacks; returns how many."""
        known = {r["id"] for r in read_jsonl(path)}
        missing = [r for r in self.instructions() if r["id"] not in known]
        with open_for_append(path) as f:
            f.writelines(json.dumps(r) + "\n" for r in missing)
        return len(missing)

    def export(self, records: list[dict], pool: list[dict]) -> dict:
        """Write the corpus records and pool records the archive lacks (by id) to new shards; returns
        how many of each were written."""
        known = {r["id"] for r in self.answers()}
        new_answers = [{k: r[k] for k in ANSWER_FIELDS} for r in records if r["id"] not in known]
        known = {r["id"] for r in self.instructions()}
        new_pool = [r for r in pool if r["id"] not in known]
        for kind, rows in (("answers", new_answers), ("pool", new_pool)):
            if rows:
                self._write(kind, rows)
        return {"answers": len(new_answers), "instructions": len(new_pool)}

    def _shards(self, kind: str) -> list[Path]:
        if not self.root.is_dir():
            return []
        found = [(m, p) for p in self.root.iterdir() if (m := _SHARD.match(p.name)) and m[1] == kind]
        return [p for m, p in sorted(found, key=lambda mp: int(mp[0][2]))]

    def _read(self, kind: str) -> list[dict]:
        rows = []
        for shard in self._shards(kind):
            with gzip.open(shard, "rt") as f:
                rows += [json.loads(line) for line in f if line.strip()]
        return rows

    def _write(self, kind: str, rows: list[dict]) -> None:
        """A new shard, written whole to a temporary name then renamed (a killed export leaves none)."""
        self.root.mkdir(parents=True, exist_ok=True)
        shards = self._shards(kind)
        number = int(_SHARD.match(shards[-1].name)[2]) + 1 if shards else 1
        path = self.root / f"{kind}-{number:04d}.jsonl.gz"
        tmp = path.with_suffix(".tmp")
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
        tmp.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
        tmp.replace(path)


def open_archive(args, target) -> CorpusArchive | None:
    """``--archive``: the directory given, the bundled one for the default model, or none."""
    if args.archive == "none" or (args.archive is None and args.model is not None):
        return None
    archive = CorpusArchive(Path(args.archive) if args.archive else BUNDLED_ARCHIVE)
    archive.check_target(target_fingerprint(target))
    return archive
