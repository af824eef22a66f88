"""Compiled code is never loaded from a cache folder another user could write (`cache_folder.py`): the C++
kernels' build at first use goes to a private folder instead, with a warning naming the folder and the
chmod, and a folder of ours (or one under /tmp's sticky bit) is used as before."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
import torch.utils.cpp_extension
from specexec.executor.layers import cpu_kernels as kernels_module
from specexec.executor.layers.measurement.cache_folder import (
    make_private_folders,
    others_could_write,
    stat_problem,
)


def fake_stat(mode: int, uid: int) -> os.stat_result:
    """An ``os.stat_result`` of ``mode`` (file type bits included) owned by ``uid``."""
    return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))


class FakeBuild:
    """torch's cpp_extension ``load``: notes where it was asked to build, leaves a ``.so`` there."""

    def __init__(self) -> None:
        self.folders: list[Path] = []

    def __call__(self, name, sources, build_directory, **kwargs):
        self.folders.append(Path(build_directory))
        (Path(build_directory) / f"{name}.so").write_text("built")


@pytest.fixture
def build_in(monkeypatch):
    """Runs the build at first use (faked) with the cache folder at the path given; the folders it was
    asked to build in come back. The real kernels come back for the tests after this."""
    fake = FakeBuild()
    monkeypatch.delenv(kernels_module.SWITCH, raising=False)
    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake)
    monkeypatch.setattr(kernels_module, "installed_library", lambda: None)

    def build(cache: Path) -> list[Path]:
        monkeypatch.setenv("SPECEXEC_CACHE_DIR", str(cache))
        kernels_module.cpu_kernels.cache_clear()
        kernels_module._usable_build_folder.cache_clear()
        assert kernels_module.cpu_kernels() is not None
        return fake.folders

    yield build
    kernels_module.cpu_kernels.cache_clear()
    kernels_module._usable_build_folder.cache_clear()


def test_a_world_writable_cache_folder_is_not_loaded_from(tmp_path, build_in, caplog):
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="specexec"):
        (folder,) = build_in(cache)
    assert cache not in folder.parents, f"built and loaded in the writable folder: {folder}"
    assert others_could_write(folder) is None
    assert f"{cache} is writable by group and others (mode 0o777)" in caplog.text
    assert "chmod go-w" in caplog.text


def test_a_library_planted_in_a_trusted_folder_with_open_write_bits_is_not_loaded(tmp_path, build_in):
    """The folder is ours but opened to everyone after the build: its library may be anyone's now."""
    cache = tmp_path / "cache"
    (first,) = build_in(cache)
    assert cache in first.parents
    first.chmod(0o757)
    second = build_in(cache)[-1]
    assert cache not in second.parents


def test_a_new_cache_folder_is_made_private_and_its_build_loaded_from_it_again(tmp_path, build_in):
    """Under a umask that lets the group write (as on systems with a group per user), the folders made
    and the library built are closed to group and others, so the next start takes them."""
    cache = tmp_path / "new" / "cache"
    old_umask = os.umask(0o002)
    try:
        build_in(cache)
        (folder,) = build_in(cache)[1:]
    finally:
        os.umask(old_umask)
    assert cache in folder.parents
    for part in (tmp_path / "new", cache, folder):
        assert stat.S_IMODE(part.stat().st_mode) == 0o700, part
    assert all(others_could_write(library) is None for library in folder.glob("*.so"))


def test_who_could_write_a_path():
    me, other = os.geteuid(), os.geteuid() + 1
    folder, sticky, file = stat.S_IFDIR, stat.S_IFDIR | stat.S_ISVTX, stat.S_IFREG
    assert stat_problem(fake_stat(folder | 0o755, me), me, is_above=False) is None
    assert stat_problem(fake_stat(folder | 0o755, 0), me, is_above=True) is None  # root's
    assert "owned by uid" in stat_problem(fake_stat(folder | 0o700, other), me, is_above=False)
    assert "owned by uid" in stat_problem(fake_stat(file | 0o644, other), me, is_above=False)
    assert "writable by group (mode 0o775)" in stat_problem(fake_stat(folder | 0o775, me), me, is_above=True)
    assert "writable by others" in stat_problem(fake_stat(file | 0o646, me), me, is_above=False)
    # /tmp: others cannot replace what is ours in it, but a folder we load from must not be sticky-shared
    assert stat_problem(fake_stat(sticky | 0o777, 0), me, is_above=True) is None
    assert stat_problem(fake_stat(sticky | 0o777, 0), me, is_above=False) is not None


def test_others_could_write_walks_every_folder_above(tmp_path):
    shared = tmp_path / "shared"
    inner = shared / "a" / "b"
    make_private_folders(inner)
    assert others_could_write(inner) is None
    shared.chmod(0o777)
    assert others_could_write(inner) == f"{shared} is writable by group and others (mode 0o777)"
    assert others_could_write(inner / "not-yet" / "made") is not None
    shared.chmod(0o700)
    (inner / "lib.so").write_text("")
    (inner / "lib.so").chmod(0o664)
    assert others_could_write(inner / "lib.so") == f"{inner / 'lib.so'} is writable by group (mode 0o664)"
