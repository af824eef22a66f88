"""Where specexec keeps what it builds and measures on this machine (converted GGUF models, the C++
kernels' builds, the measurements), and whether a folder there can be trusted with code that gets loaded.

A library loaded from a folder that another user could write runs their code as ours. As ssh refuses a
key file (``StrictModes``), `others_could_write` refuses a path where it, or any folder above it, is
owned by another user than us or root, or writable by group or others; a folder above with the sticky
bit (``/tmp``) is taken, since others cannot rename or remove what is ours in it.
`make_private_folders` makes the folders it creates ``0o700``, whatever the umask.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def resolve_cache_dir(configured: str | os.PathLike | None = None) -> Path:
    """specexec's cache folder (converted GGUF models, this machine's measurements): ``configured``
    (`ExecutorConfig.cache_dir`) when given, else ``$SPECEXEC_CACHE_DIR``, else ``~/.cache/specexec``."""
    if configured is not None:
        return Path(configured).expanduser()
    return default_cache_dir()


def default_cache_dir() -> Path:
    env = os.environ.get("SPECEXEC_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specexec"


def others_could_write(path: str | os.PathLike) -> str | None:
    """Why a user other than us (or root) could have written ``path`` or put something else in its place
    ("/x/cache is writable by group and others (mode 0o777)"), or None when nobody could. Parts of the
    path that do not exist yet are skipped: what is created there later is checked when it is used."""
    uid = os.geteuid()
    real = Path(os.path.realpath(path))
    chain = [real, *real.parents]  # the path first, the root last
    stats = {}
    for part in chain:
        try:
            stats[part] = os.stat(part)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            return f"{part}'s owner and mode cannot be read ({exc})"
    for i, part in enumerate(chain):
        problem = stat_problem(stats[part], uid, is_above=i > 0) if part in stats else None
        if problem is not None:
            return f"{part} {problem}"
    return None


def stat_problem(st: os.stat_result, uid: int, is_above: bool) -> str | None:
    """What lets another user write an entry with status ``st`` (owned by whom, writable by whom), for a
    process of ``uid``; ``is_above``: a folder above the path asked about."""
    if st.st_uid not in (uid, 0):
        return f"is owned by uid {st.st_uid}, not by this user ({uid}) or root"
    writable = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit]
    if not writable:
        return None
    if is_above and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
        return None  # sticky (/tmp): others cannot replace what is ours in it
    return f"is writable by {' and '.join(writable)} (mode {oct(stat.S_IMODE(st.st_mode))})"


def make_private_folders(folder: Path) -> None:
    """Create ``folder`` and the folders above it that are missing with mode ``0o700`` (Path.mkdir
    gives the ones above the umask's default)."""
    missing = []
    for part in (folder, *folder.parents):
        if part.exists():
            break
        missing.append(part)
    for part in reversed(missing):
        with contextlib.suppress(FileExistsError):  # (made meanwhile by another process)
            part.mkdir(mode=0o700)
