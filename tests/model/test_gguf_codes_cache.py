"""The ``gguf`` scheme's conversion cache keeps no dense copy of the weights the file holds
(`gguf_codes.py`, `gguf_sources.py`): a model loaded from it computes bit for bit what the dense
cache's model computes once quantized the same way, in every dtype, kernel choice and decoder, with
the layers that stay dense read back from the file; no placeholder outlives the load."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
from gguf_files import FAMILIES, write_gguf
from safetensors import safe_open
from specexec.executor.layers.quantized.gguf_sources import GGUFSource, placeholder, source_of
from specexec.executor.layers.quantized.quantization import quantize_model
from specexec.executor.model.gguf_codes import sources_in
from specexec.executor.model.model_loader import default_model_path, load_model

PROMPT = [1, 504, 3365, 314, 260, 1977, 28, 3158, 11, 284, 46]
TINY_PROMPT = [72, 101, 108, 108, 111, 44, 32, 119]  #: within the family files' byte-level vocabularies


#: the shipped model's conversions go to the default cache folder, which the suite's other tests share
SHARED_CACHE = None


def prompt_logits(model, ids=PROMPT) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def _dense_path(path, dtype, kernel, model_impl, cache_dir):
    """What ``quantization: gguf`` loaded before this cache: the dense conversion, then the file's codes."""
    loaded = load_model(path, dtype=dtype, model_impl=model_impl, cache_dir=cache_dir, progress=False)
    report = quantize_model(loaded.model, "gguf", loaded.gguf_path, kernel)
    return loaded.model, report


def _assert_same_weights(model, reference) -> None:
    """The same parameters and buffers (the quantized layers' tiles, scales and offsets included)."""
    mine, theirs = model.state_dict(), reference.state_dict()
    assert mine.keys() == theirs.keys()
    for name, tensor in mine.items():
        assert tensor.dtype == theirs[name].dtype and torch.equal(tensor, theirs[name]), name


def _codes_folder(cache_dir):
    (folder,) = [f for f in cache_dir.iterdir() if "-codes-" in f.name]
    return folder


def _cache_folder_of(loaded) -> Path:
    """The cache folder a load used, from its source line ("... (cached conversion at FOLDER)")."""
    match = re.search(r" at (.+)\)$", loaded.source)
    assert match, loaded.source
    return Path(match[1])


@pytest.mark.parametrize(
    ("dtype", "kernel", "model_impl"),
    [("float32", "auto", "specexec"), ("bfloat16", "auto", None), ("bfloat16", "torch", "specexec")],
)
def test_the_shipped_model_from_the_codes_cache_equals_the_dense_path(dtype, kernel, model_impl):
    reference, report = _dense_path(None, dtype, kernel, model_impl, SHARED_CACHE)
    for _ in range(2):  # the first may convert, the second reads the cache
        loaded = load_model(
            None,
            dtype=dtype,
            quantization="gguf",
            quantized_kernel=kernel,
            model_impl=model_impl,
            cache_dir=SHARED_CACHE,
            progress=False,
        )
        assert "cached conversion" in loaded.source or "converted now" in loaded.source
        assert loaded.quantization.layers == report.layers
        assert loaded.quantization.weight_bytes == report.weight_bytes
        _assert_same_weights(loaded.model, reference)
        if model_impl is None:  # transformers' forward (the own decoder's runs in the executor)
            assert torch.equal(prompt_logits(loaded.model), prompt_logits(reference))
        assert not any(source_of(p) is not None for p in loaded.model.parameters()), (
            "a placeholder outlived the load"
        )
    assert "cached conversion" in loaded.source


def test_the_codes_cache_holds_no_matrix():
    """Every linear weight and the embedding are the file's by reference; only norms are stored."""
    loaded = load_model(None, dtype="float32", quantization="gguf", cache_dir=SHARED_CACHE, progress=False)
    folder = _cache_folder_of(loaded)
    assert "-codes-" in folder.name
    with safe_open(folder / "dense.safetensors", framework="pt") as dense:
        shapes = {name: dense.get_slice(name).get_shape() for name in dense.keys()}  # noqa: SIM118
    assert shapes and all(len(shape) == 1 for shape in shapes.values()), shapes
    by_reference = sources_in(folder)
    assert len(by_reference) == 30 * 7 + 1  # 30 layers' q, k, v, o, gate, up, down and the tied embedding
    assert by_reference["model.embed_tokens.weight"] == "token_embd.weight"
    stored = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    assert stored < default_model_path().stat().st_size / 20


def test_a_placeholder_gives_nan_not_numbers():
    """A weight read before it was filled shows as NaN in whatever it computes."""
    weight = placeholder((4, 8), torch.float32, GGUFSource(default_model_path(), ()))
    assert weight.untyped_storage().nbytes() == 4, "one value viewed at every position"
    assert torch.isnan(torch.ones(2, 8) @ weight.T).all()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_file_from_the_codes_cache_equals_the_dense_path(tmp_path, family):
    """Float32 files: their layers stay dense under ``gguf`` and are read back from the file."""
    path = tmp_path / f"{family}.gguf"
    write_gguf(path, family)
    reference, _ = _dense_path(path, "float32", "auto", "auto", tmp_path / "cache")
    loaded = load_model(
        path,
        dtype="float32",
        quantization="gguf",
        model_impl="auto",
        cache_dir=tmp_path / "cache",
        progress=False,
    )
    _assert_same_weights(loaded.model, reference)
    assert sources_in(_codes_folder(tmp_path / "cache")), "the file's matrices are kept by reference"


def test_an_unreadable_codes_cache_is_rebuilt(tmp_path, caplog):
    path = tmp_path / "llama3.gguf"
    write_gguf(path, "llama3")
    first = load_model(path, dtype="float32", quantization="gguf", cache_dir=tmp_path, progress=False)
    (_codes_folder(tmp_path) / "gguf_rows.safetensors").write_bytes(b"not safetensors")
    with caplog.at_level(logging.WARNING, logger="specexec"):
        again = load_model(path, dtype="float32", quantization="gguf", cache_dir=tmp_path, progress=False)
    assert "unreadable" in caplog.text and "converted now" in again.source
    assert torch.equal(prompt_logits(again.model, TINY_PROMPT), prompt_logits(first.model, TINY_PROMPT))
