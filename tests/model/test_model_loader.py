"""Tests for specexec.executor.model_loader."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch
from specexec.executor.model import model_loader
from specexec.executor.model.model_loader import LoadedModel, ModelLoadError, default_model_path, load_model
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def _tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg)


def _tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(29)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def _write_header_only_gguf(path: Path) -> None:
    """A GGUF file with a header and no tensors: what the fake conversions below stand in for."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def loaded_logits(loaded: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return loaded.model(ids).logits


@pytest.fixture
def model_only_dir(tmp_path: Path) -> Path:
    """The tiny llama saved without a tokenizer."""
    path = tmp_path / "tiny"
    _tiny_model().save_pretrained(path)
    return path


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_load_directory_honours_dtype(model_only_dir: Path, dtype: str) -> None:
    loaded = load_model(model_only_dir, dtype=dtype, progress=False)
    assert loaded.model.dtype == getattr(torch, dtype)
    assert loaded.tokenizer is None
    assert loaded.source == str(model_only_dir)
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert loaded_logits(loaded, torch.tensor([[1, 5, 7]])).shape == (1, 3, 32)


def test_load_directory_with_tokenizer(model_only_dir: Path) -> None:
    _tiny_tokenizer().save_pretrained(model_only_dir)
    loaded = load_model(model_only_dir, progress=False)
    assert loaded.tokenizer is not None
    assert loaded.tokenizer("w1 w2").input_ids == [4, 5]


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "model.gguf"
    with pytest.raises(ModelLoadError, match="does not exist") as err:
        load_model(missing)
    assert str(missing) in str(err.value)


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="config.json") as err:
        load_model(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_junk_file_is_not_gguf(tmp_path: Path) -> None:
    junk = tmp_path / "x.gguf"
    junk.write_bytes(b"this is not a model at all" * 10)
    with pytest.raises(ModelLoadError, match="GGUF") as err:
        load_model(junk, cache_dir=tmp_path / "cache")
    assert str(junk) in str(err.value)


def test_truncated_real_gguf(tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.gguf"
    with default_model_path().open("rb") as fh:
        truncated.write_bytes(fh.read(1 << 20))
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match="corrupt") as err:
        load_model(truncated, cache_dir=cache, progress=False)
    assert str(truncated) in str(err.value)
    assert err.value.__cause__ is not None
    assert not cache.exists() or not any(cache.iterdir())


def test_bad_dtype_and_device(model_only_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="float32, bfloat16, float16, float64"):
        load_model(model_only_dir, dtype="int8")
    with pytest.raises(ModelLoadError, match="unsupported device"):
        load_model(model_only_dir, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA is not available"):
            load_model(model_only_dir, device="cuda")


def test_default_model_path() -> None:
    path = default_model_path()
    assert path.suffix == ".gguf" and path.is_file()


def test_conversion_cache_logic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cache write/read/rebuild/atomicity, with the slow GGUF dequantization replaced by a tiny model."""
    fake = tmp_path / "fake.gguf"
    _write_header_only_gguf(fake)
    calls: list[Path] = []

    def fake_convert(path: Path):
        calls.append(path)
        return _tiny_model(), _tiny_tokenizer()

    monkeypatch.setattr(model_loader, "_convert_gguf", fake_convert)
    cache = tmp_path / "cache"
    ids = torch.tensor([[1, 4, 5]])

    first = load_model(fake, cache_dir=cache, progress=False)
    assert len(calls) == 1 and "converted now" in first.source
    (entry,) = list(cache.iterdir())  # exactly one folder, no temp leftovers
    assert entry.name.startswith("fake-")
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        assert (entry / name).is_file(), name

    second = load_model(fake, cache_dir=cache, progress=False)
    assert len(calls) == 1 and f"cached conversion at {entry}" in second.source
    assert second.tokenizer is not None
    assert torch.equal(loaded_logits(first, ids), loaded_logits(second, ids))

    (entry / "model.safetensors").unlink()  # corrupt cache -> detected and rebuilt
    third = load_model(fake, cache_dir=cache, dtype="float64", progress=False)
    assert len(calls) == 2 and "converted now" in third.source and third.model.dtype == torch.float64
    (entry / "model.safetensors").write_bytes(b"garbage")  # unreadable weights -> rebuilt too
    load_model(fake, cache_dir=cache, progress=False)
    assert len(calls) == 3 and list(cache.iterdir()) == [entry]

    def crash(*args, **kwargs):
        raise RuntimeError("interrupted")

    def convert_then_crash(path: Path):
        tokenizer = _tiny_tokenizer()
        tokenizer.save_pretrained = crash  # dies after the model weights were written
        return _tiny_model(), tokenizer

    monkeypatch.setattr(model_loader, "_convert_gguf", convert_then_crash)
    other = tmp_path / "cache2"
    with pytest.raises(RuntimeError, match="interrupted"):
        load_model(fake, cache_dir=other, progress=False)
    assert list(other.iterdir()) == []  # no half-written cache, temp dir removed

    def unwritable(*args, **kwargs):
        raise PermissionError("read-only cache")

    monkeypatch.setattr(model_loader, "_convert_gguf", fake_convert)
    monkeypatch.setattr(model_loader, "_write_cache", unwritable)
    fallback = load_model(fake, cache_dir=other, dtype="float64", progress=False)
    assert "not cached" in fallback.source and fallback.model.dtype == torch.float64


@pytest.mark.slow
def test_real_default_model_cached(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = load_model(cache_dir=cache)
    assert "cached conversion at" not in first.source and "converted now" in first.source
    second = load_model(cache_dir=cache)
    assert "cached conversion at" in second.source and str(cache) in second.source
    assert first.tokenizer is not None and second.tokenizer is not None
    ids = first.tokenizer("The capital of France is", return_tensors="pt").input_ids
    assert torch.equal(ids, second.tokenizer("The capital of France is", return_tensors="pt").input_ids)
    assert torch.equal(loaded_logits(first, ids), loaded_logits(second, ids))
    assert first.model.dtype == torch.float32 and not second.model.training


def test_a_tokenizer_that_reloads_broken_is_refused_and_its_cache_removed(tmp_path, monkeypatch) -> None:
    """transformers 5.5.x saved GGUF tokenizers that reloaded with spaces turned into a special token:
    the conversion checks the reloaded tokenizer against the one it converted."""
    fake = tmp_path / "fake.gguf"
    _write_header_only_gguf(fake)
    monkeypatch.setattr(model_loader, "_convert_gguf", lambda path: (_tiny_model(), _tiny_tokenizer()))
    real_load_dir = model_loader._load_dir

    def load_dir_with_a_broken_tokenizer(*args, **kwargs):
        loaded = real_load_dir(*args, **kwargs)
        encode = loaded.tokenizer.encode
        loaded.tokenizer.encode = lambda text, **kw: encode(text.replace(" ", "<|endoftext|>"), **kw)
        return loaded

    monkeypatch.setattr(model_loader, "_load_dir", load_dir_with_a_broken_tokenizer)
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match=r"reloads wrong .*transformers 5\.5\.x"):
        load_model(fake, cache_dir=cache, progress=False)
    assert list(cache.iterdir()) == [], "the broken conversion must not be loaded again"
    monkeypatch.setattr(model_loader, "_load_dir", real_load_dir)
    assert "converted now" in load_model(fake, cache_dir=cache, progress=False).source
