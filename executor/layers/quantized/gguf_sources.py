"""Weights left in the GGUF file: parameters of a converted model that are a GGUF tensor's rows, reordered.

The ``gguf`` quantization's conversion cache (`model_loader`) keeps no dense copy of such a weight, only
the tensor's name and the row order that `match_rows` found when the file was first converted. A load
from that cache gives each one a placeholder (one NaN viewed at every position: no memory, and NaN in
any output computed from it by mistake) that carries its source; quantization takes the codes straight
from the file (`quantization._stacked`), and whatever layer stays dense is dequantized from the file
(`materialize_placeholders`), with gguf-py's dequantization, the one transformers' conversion uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .gguf_index import read_gguf_index
from .gguf_weights import GGUFFile, match_rows
from .quantized_linear import QuantizationError


@dataclass(frozen=True, slots=True)
class GGUFSource:
    """Where a weight's rows are: GGUF tensors, each with the order of its rows, stacked in this order."""

    path: Path
    parts: tuple[tuple[str, torch.Tensor], ...]  #: (tensor name, order [tensor rows]) in row order

    def order_of(self, tensor_name: str) -> torch.Tensor:
        for name, order in self.parts:
            if name == tensor_name:
                return order
        raise QuantizationError(f"{tensor_name} is not among the sources {[n for n, _ in self.parts]}")


def find_sources(model: nn.Module, path: Path) -> dict[str, tuple[str, torch.Tensor]]:
    """Parameter name -> (GGUF tensor name, row order) for each of ``model``'s (dense, float32) matrices
    that is exactly the named tensor's dequantized rows in that order; the others are not listed."""
    file = GGUFFile(path)
    sources = {}
    for name, parameter in model.named_parameters():
        module_name, _, leaf = name.rpartition(".")
        tensor = file.tensor_for(module_name) if leaf == "weight" and parameter.dim() == 2 else None
        if tensor is None or tuple(tensor.shape) != tuple(parameter.shape):
            continue
        stored = _float32_rows(tensor.blocks, tensor.type_name, tensor.shape[0])
        try:
            order = match_rows(stored, parameter.detach(), name)
        except QuantizationError:
            continue  # not the file's rows as they are (transformers changed the values): kept dense
        sources[name] = (tensor.name, order)
    return sources


def placeholder(shape: torch.Size | tuple[int, ...], dtype: torch.dtype, source: GGUFSource) -> nn.Parameter:
    """A parameter of ``shape`` and ``dtype`` whose values are in the file at ``source``."""
    parameter = nn.Parameter(torch.full((), float("nan"), dtype=dtype).expand(*shape), requires_grad=False)
    parameter.gguf_source = source  # type: ignore[attr-defined]
    return parameter


def source_of(tensor: torch.Tensor | None) -> GGUFSource | None:
    return getattr(tensor, "gguf_source", None)


def stacked_placeholder(weights: list[torch.Tensor]) -> nn.Parameter | None:
    """One placeholder for ``weights``' rows one after another (a fused layer's), if all are
    placeholders of one file; else None (the caller stacks dense weights)."""
    sources = [source_of(w) for w in weights]
    if any(s is None for s in sources) or len({s.path for s in sources}) != 1:  # type: ignore[union-attr]
        return None
    rows = sum(w.shape[0] for w in weights)
    parts = tuple(part for source in sources for part in source.parts)  # type: ignore[union-attr]
    return placeholder((rows, weights[0].shape[1]), weights[0].dtype, GGUFSource(sources[0].path, parts))


def dense(tensor: torch.Tensor, indexes: dict[Path, dict] | None = None) -> torch.Tensor:
    """``tensor`` itself, or a placeholder's values read from its file (``indexes``: the files' tensor
    directories already read, by path; filled as files are read)."""
    source = source_of(tensor)
    if source is None:
        return tensor
    indexes = {} if indexes is None else indexes
    if source.path not in indexes:
        indexes[source.path] = read_gguf_index(source.path).tensors
    return _dequantized(source, indexes[source.path]).to(tensor.dtype)


def materialize_placeholders(module: nn.Module) -> int:
    """Replace every placeholder parameter under ``module`` by its values (tied ones stay tied); returns
    how many were read from their files."""
    done: dict[int, nn.Parameter] = {}
    indexes: dict[Path, dict] = {}
    for owner in module.modules():
        for leaf, parameter in list(owner.named_parameters(recurse=False)):
            if source_of(parameter) is None:
                continue
            if id(parameter) not in done:
                done[id(parameter)] = nn.Parameter(dense(parameter, indexes), requires_grad=False)
            setattr(owner, leaf, done[id(parameter)])
    return len(done)


def _dequantized(source: GGUFSource, tensors: dict) -> torch.Tensor:  # [rows, cols] float32
    parts = []
    for name, order in source.parts:
        entry = tensors.get(name)
        if entry is None:
            raise QuantizationError(
                f"{source.path} has no tensor {name}: the file changed after it was cached"
            )
        parts.append(_float32_rows(entry.data, entry.type_name, len(order))[order])
    return torch.cat(parts)


def _float32_rows(data: np.ndarray, type_name: str, rows: int) -> torch.Tensor:  # [rows, cols] float32
    """A GGUF tensor's values as gguf-py dequantizes them (a copy where it returns the mapped file)."""
    from gguf import GGMLQuantizationType, dequantize

    values = dequantize(np.asarray(data), GGMLQuantizationType[type_name]).reshape(rows, -1)
    return torch.from_numpy(values if values.flags.writeable else values.copy())
