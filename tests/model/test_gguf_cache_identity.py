"""A GGUF's conversion caches serve the file as it is now (`gguf_fingerprint.py`): a file copied over
another with its timestamps kept (``cp -p``, ``rsync -a``) loads as the new file from the dense cache
and from the codes cache (which had given the old norms with the new matrices), the same file at a new
identity is never served wrong, and a codes cache whose file's tensors changed type or shape is refused."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from gguf_files import FAMILIES, make_source_model, write_gguf
from specexec.executor.model.gguf_codes import StaleCodesCache, load_codes_cache
from specexec.executor.model.model_loader import load_model

FAMILY = "llama3"
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119]  #: within the family file's byte-level vocabulary
FIXED_TIME_NS = 1_700_000_000 * 10**9  #: the timestamps an image build or ``cp -p`` leaves on both files


def write_model_file(path: Path, seed: int) -> None:
    """A family file of ``seed``'s random weights, norms included (a fresh model's are all ones, which
    would hide old norms served with new matrices), with fixed timestamps."""
    model = make_source_model(FAMILIES[FAMILY], seed=seed)
    generator = torch.Generator().manual_seed(seed)
    for parameter in model.parameters():
        if parameter.dim() == 1:
            parameter.copy_(1 + 0.5 * torch.rand(parameter.shape, generator=generator))
    write_gguf(path, FAMILY, model)
    os.utime(path, ns=(FIXED_TIME_NS, FIXED_TIME_NS))


def copy_keeping_times(source: Path, target: Path) -> None:
    """``cp -p source target``: the contents written over ``target`` in place, ``source``'s times kept."""
    shutil.copy2(source, target)
    stat = source.stat()
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def load(path: Path, cache: Path, quantization: str | None):
    return load_model(path, dtype="float32", quantization=quantization, cache_dir=cache, progress=False)


def logits(model) -> torch.Tensor:  # [1, len(PROMPT), vocab]
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits


def same_weights(model, reference) -> bool:
    mine, theirs = model.state_dict(), reference.state_dict()
    return mine.keys() == theirs.keys() and all(torch.equal(t, theirs[n]) for n, t in mine.items())


@pytest.fixture
def two_files(tmp_path):
    """(first, second): files of one size, header and timestamps, with other values."""
    first, second = tmp_path / "first.gguf", tmp_path / "second.gguf"
    write_model_file(first, seed=0)
    write_model_file(second, seed=1)
    assert first.stat().st_size == second.stat().st_size
    assert first.stat().st_mtime_ns == second.stat().st_mtime_ns
    return first, second


@pytest.mark.parametrize("quantization", [None, "gguf"], ids=["dense-cache", "codes-cache"])
def test_a_file_copied_over_with_its_times_kept_loads_as_the_new_file(
    tmp_path, two_files, quantization, caplog
):
    first, second = two_files
    served = tmp_path / "model.gguf"
    copy_keeping_times(first, served)
    cache = tmp_path / "cache"
    before = load(served, cache, quantization)
    assert "converted now" in before.source
    assert "cached conversion" in load(served, cache, quantization).source  # the cache is used
    want = load(second, tmp_path / "reference-cache", quantization).model
    assert not same_weights(before.model, want)  # (the two files hold other values)

    copy_keeping_times(second, served)
    with caplog.at_level(logging.WARNING, logger="specexec"):
        after = load(served, cache, quantization)
    assert "converted now" in after.source
    assert "is not of" in caplog.text and "ctime_ns changed" in caplog.text
    assert same_weights(after.model, want)
    assert torch.equal(logits(after.model), logits(want))
    again = load(served, cache, quantization)
    assert "cached conversion" in again.source and same_weights(again.model, want)


@pytest.mark.parametrize("quantization", [None, "gguf"], ids=["dense-cache", "codes-cache"])
def test_the_same_file_at_a_new_identity_is_rebuilt_not_served_stale(tmp_path, two_files, quantization):
    """A copy renamed into place (``rsync -a``'s way: a new inode) of the same contents: rebuilding is fine,
    serving anything but these values is not."""
    first, _ = two_files
    served, cache = tmp_path / "model.gguf", tmp_path / "cache"
    copy_keeping_times(first, served)
    want = load(served, cache, quantization).model
    staged = tmp_path / ".model.gguf.partial"
    copy_keeping_times(first, staged)
    os.replace(staged, served)
    after = load(served, cache, quantization)
    assert same_weights(after.model, want)
    assert torch.equal(logits(after.model), logits(want))


def test_a_codes_cache_checks_each_referenced_tensor_against_the_file(tmp_path, two_files):
    """Even read past the loader's check, the codes cache refuses a file whose referenced tensors are not
    of the type and shape it recorded."""
    first, _ = two_files
    cache = tmp_path / "cache"
    load(first, cache, "gguf")
    (folder,) = [f for f in cache.iterdir() if "-codes-" in f.name]
    other = tmp_path / "other.gguf"
    write_gguf(other, "qwen2")  # other shapes and names
    with pytest.raises(StaleCodesCache, match="not the one the cache was made from"):
        load_codes_cache(folder, torch.float32, other)
    model, _ = load_codes_cache(folder, torch.float32, first)  # (the file it was made from is taken)
    assert model is not None
