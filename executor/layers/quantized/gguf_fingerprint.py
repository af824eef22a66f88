"""What a cached conversion of a GGUF file was made from, and whether the file at its path is still that.

The conversion caches (`model_loader`'s dense copy, and `gguf_codes`' norms kept dense with the matrices
left in the file by reference) hold values taken from the whole file but are found by its path. Neither
the path nor (path, size, mtime) names the values: ``cp -p``, ``rsync -a`` and images built with fixed
times write other values under the same size and timestamps, and then the dense cache served the old
model and the codes cache the old norms with the new matrices. A cache is used only while both hold:

- the header digest (`gguf_index.GGUFIndex.header_digest`: the metadata and the tensor directory, every
  tensor's name, type, dimensions and offset) is the one it recorded: another model, quantization or
  layout is seen whatever the file's timestamps say;
- the file's identity (inode, size, mtime and ctime, in nanoseconds) is the one it recorded: new values
  under the same header are seen, since a copy or a write in place gets a new ctime (only the kernel
  sets it; ``os.utime`` cannot) and a copy renamed into place a new inode.

A digest of every tensor's bytes would name the values exactly but reads the whole file at each start
(seconds per GB); a chmod, a ``touch`` or a copy of the same file is then a rebuild, never a wrong model.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .gguf_index import read_gguf_index

#: the identity fields, as a cache records them
IDENTITY_FIELDS = ("inode", "size", "mtime_ns", "ctime_ns")


@dataclass(frozen=True, slots=True)
class GGUFFingerprint:
    """A GGUF file as a cache made from it records it."""

    header_sha256: str  #: `GGUFIndex.header_digest`
    inode: int
    size: int  #: bytes
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: str | os.PathLike) -> GGUFFingerprint:
        """The file at ``path`` now (``GGUFFormatError`` if its header is malformed). Its identity is
        taken before its header is read: a file changed in between records the older identity, which
        the next start sees as changed."""
        stat = os.stat(path)
        digest = read_gguf_index(Path(path)).header_digest
        return cls(digest, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)

    def as_record(self) -> dict[str, str | int]:
        return asdict(self)

    def mismatch(self, recorded: object) -> str | None:
        """Why a cache that recorded ``recorded`` (`as_record`'s dict, or whatever a cache folder held)
        was not made from this file as it is now; None when it was."""
        if not isinstance(recorded, dict) or set(recorded) != {f.name for f in fields(self)}:
            return "it records no fingerprint of the file (written by an older specexec, or damaged)"
        if recorded["header_sha256"] != self.header_sha256:
            return "the file's header or tensor directory changed (another model, quantization or layout)"
        changed = [name for name in IDENTITY_FIELDS if recorded[name] != getattr(self, name)]
        if changed:
            return (
                f"the file was replaced or written since (its {', '.join(changed)} changed), so its values "
                "may differ under the same header"
            )
        return None
