"""The ``gguf`` quantization's conversion cache: a GGUF's converted model without a dense copy of the
weights the file holds.

Quantizing a GGUF takes its layers' codes from the file itself, so a dense float32 copy of them (4x-8x the
file, on disk and while loading) is only needed to find which converted rows each GGUF row became. This
cache keeps that answer instead: per weight that is exactly a GGUF tensor's rows reordered
(`gguf_sources.find_sources`), the tensor's name and the order; the other tensors (norms, biases,
whatever transformers' conversion changed) dense in ``dense.safetensors``; the config, generation
config and tokenizer as the dense cache keeps them. Loading builds the model without weights, puts the
dense tensors in, and gives the rest placeholders that quantization fills from the file's codes.

The cache records each referenced tensor's type and dimensions (``gguf_tensors.json``), and a load checks
them against the file's tensor directory: a file that is not the one the cache was made from (which
`model_loader` checks first, `gguf_fingerprint.py`) must never lend its matrices to the cached norms.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from accelerate import init_empty_weights
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel

from ..layers.quantized.gguf_index import TensorEntry, read_gguf_index
from ..layers.quantized.gguf_sources import GGUFSource, placeholder

#: 1: the first layout (weights by reference in ``gguf_rows.safetensors``, the rest in ``dense.safetensors``);
#: 2: with the referenced tensors' types and dimensions (``gguf_tensors.json``), checked at each load
CODES_CACHE_VERSION = 2
_DENSE, _ROWS, _DIRECTORY = "dense.safetensors", "gguf_rows.safetensors", "gguf_tensors.json"


class StaleCodesCache(ValueError):
    """The GGUF file's tensors are not those the codes cache was made from."""


def save_codes_cache(
    model: PreTrainedModel, sources: dict[str, tuple[str, torch.Tensor]], folder: Path, gguf_path: Path
) -> None:
    """Write ``model``'s config, its tensors but those in ``sources`` (parameter name -> GGUF tensor
    name, row order), the sources and their tensors' types and dimensions in ``gguf_path`` into ``folder``."""
    model.config.save_pretrained(folder)
    directory = read_gguf_index(gguf_path).tensors
    referenced = {tensor: _described(directory[tensor]) for tensor, _ in sources.values()}
    (folder / _DIRECTORY).write_text(json.dumps(referenced, indent=1, sort_keys=True))
    by_reference = {model.get_parameter(name).data_ptr() for name in sources}
    kept: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():  # a tied weight once, under its first name
        if tensor.data_ptr() in by_reference or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        kept[name] = tensor.detach().contiguous()
    save_file(kept, folder / _DENSE)
    orders = {  # most are in the file's order: those are kept as their names alone
        name: order.to(torch.int64).contiguous()
        for name, (_, order) in sources.items()
        if not torch.equal(order, torch.arange(len(order)))
    }
    save_file(orders, folder / _ROWS, metadata={name: tensor for name, (tensor, _) in sources.items()})


def load_codes_cache(folder: Path, dtype: torch.dtype, gguf_path: Path) -> tuple[PreTrainedModel, object]:
    """The model (the weights the file holds as placeholders, `gguf_sources.py`) and the tokenizer saved
    in ``folder``; raises what reading it raised, `StaleCodesCache` where ``gguf_path``'s tensors are not
    those recorded, or ValueError for a parameter left without values."""
    recorded = json.loads((folder / _DIRECTORY).read_text())
    directory = read_gguf_index(gguf_path).tensors
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with init_empty_weights(include_buffers=False):  # parameters on "meta": no memory, no init
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with safe_open(folder / _DENSE, framework="pt") as dense:
        state = {name: dense.get_tensor(name).to(dtype) for name in dense.keys()}  # noqa: SIM118
    model.load_state_dict(state, strict=False, assign=True)
    with safe_open(folder / _ROWS, framework="pt") as rows:
        reordered = set(rows.keys())
        for name, tensor_name in (rows.metadata() or {}).items():
            module, _, leaf = name.rpartition(".")
            shape = model.get_parameter(name).shape
            order = rows.get_tensor(name) if name in reordered else torch.arange(shape[0])
            _check_tensor(gguf_path, directory, recorded, tensor_name, name, shape, len(order))
            parts = ((tensor_name, order),)
            setattr(
                model.get_submodule(module), leaf, placeholder(shape, dtype, GGUFSource(gguf_path, parts))
            )
    model.tie_weights()
    missing = [name for name, parameter in model.named_parameters() if parameter.is_meta]
    if missing:
        raise ValueError(f"no values for {missing[:4]}")
    model.generation_config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    return model, AutoTokenizer.from_pretrained(folder, local_files_only=True)


def sources_in(folder: Path) -> dict[str, str]:
    """Parameter name -> GGUF tensor name of the weights a codes cache keeps by reference."""
    with safe_open(folder / _ROWS, framework="pt") as rows:
        return dict(rows.metadata() or {})


def _described(entry: TensorEntry) -> dict:
    return {"type": entry.type_name, "dims": list(entry.dims)}


def _check_tensor(
    gguf_path: Path,
    directory: dict[str, TensorEntry],
    recorded: dict,
    tensor_name: str,
    parameter: str,
    shape: torch.Size,
    num_rows: int,
) -> None:
    """Refuse (`StaleCodesCache`) a referenced tensor the file does not hold as recorded, or whose shape
    is not the parameter's (``shape``, with ``num_rows`` rows in the recorded order)."""
    entry = directory.get(tensor_name)
    now = None if entry is None else _described(entry)
    if now is None or now != recorded.get(tensor_name):
        raise StaleCodesCache(
            f"{gguf_path}'s tensor {tensor_name} is {now or 'missing'} where the cache recorded "
            f"{recorded.get(tensor_name)}: the file is not the one the cache was made from"
        )
    if tuple(reversed(now["dims"])) != tuple(shape) or num_rows != shape[0]:
        raise StaleCodesCache(
            f"{gguf_path}'s tensor {tensor_name} (dimensions {now['dims']}) cannot hold {parameter} "
            f"{list(shape)} with {num_rows} rows in its order"
        )
