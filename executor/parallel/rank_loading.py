"""One rank's shard read from a Hugging Face checkpoint (safetensors) without the whole model in memory.

The model is built with empty weights (its buffers real: rotary frequencies, Gemma's embedding scale),
the replicated parts (embedding, final norm) are read, then each decoder layer in turn is read from the
files, converted to the own decoder, quantized as configured, sliced to this rank's share
(`sharding.shard_layer`) and its whole weights dropped; the LM head is read as this rank's rows only. At
its peak a rank holds its shard, the replicated parts and one whole layer.

The shard equals `sharding.shard_model`'s of the whole model loaded, quantized and converted the usual
way (the same conversion, quantization and slicing, layer by layer; per-row and per-group scales do
not change when rows are cut, so the head is quantized after its rows are read). Anything else (a GGUF,
the ``gguf`` scheme, a model the own decoder does not run, a checkpoint whose names are not the
model's) gets None, and the caller loads the whole model.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from ..layers.norm import RMSNorm
from ..layers.quantized.quantization import quantize_model
from ..model.decoder.convert import FAMILIES, convert_layer, rotary_tables, unsupported_reason
from .sharding import VocabParallelHead, report_held_dense, shard_layer, vocab_rows_of
from .weight_slices import dense_linear, take_rows

logger = logging.getLogger("specexec")


class _Checkpoint:
    """Tensor names -> the safetensors file holding each; tensors read one at a time (memory-mapped)."""

    def __init__(self, files: list[Path]) -> None:
        from safetensors import safe_open

        self._open = [safe_open(str(f), framework="pt") for f in files]
        self._where = {name: handle for handle in self._open for name in handle.keys()}  # noqa: SIM118 (a file, not a dict)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def tensor(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        return self._where[name].get_tensor(name).to(dtype)

    def rows(self, name: str, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        return self._where[name].get_slice(name)[start:stop].to(dtype)  # [stop - start, ...]


@torch.no_grad()
def load_shard(
    path: str | Path, dtype: torch.dtype, quantization: str | None, rank: int, world: int, comm
) -> nn.Module | None:
    """Rank ``rank``'s shard of the checkpoint at ``path`` (see the module doc), or None."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files or quantization == "gguf":
        return None
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    checkpoint = _Checkpoint(files)
    head_name = "model.embed_tokens.weight" if _tied(model) else "lm_head.weight"
    missing = [n for n, _ in model.named_parameters() if n not in checkpoint and n != "lm_head.weight"]
    if head_name not in checkpoint:
        missing.append(head_name)
    why = unsupported_reason(model) or (f"the checkpoint lacks {missing[0]}" if missing else None)
    if why is not None:
        logger.info("tensor parallelism: rank %d loads the whole model: %s", rank, why)
        return None
    decoder, text_config = model.model, config.get_text_config()
    family = FAMILIES[type(model).__name__]
    for module, prefix in ((decoder.embed_tokens, "model.embed_tokens."), (decoder.norm, "model.norm.")):
        _read(module, prefix, checkpoint, dtype)
    decoder.rotary_tables = rotary_tables(decoder.rotary_emb, text_config, family, dtype)
    decoder.norm = RMSNorm.from_module(decoder.norm)
    held_dense = []
    for i, hf_layer in enumerate(decoder.layers):
        _read(hf_layer, f"model.layers.{i}.", checkpoint, dtype)
        layer = convert_layer(hf_layer, text_config, family)
        if quantization:
            quantize_model(layer, quantization)
        held_dense += shard_layer(layer, layer, rank, world, comm)
        decoder.layers[i] = layer  # (the whole layer's weights go with hf_layer)
    model.lm_head = _head_rows(model, checkpoint, head_name, dtype, quantization, rank, world, comm)
    report_held_dense(held_dense, rank)
    return model.eval()


def _tied(model: nn.Module) -> bool:
    return bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))


def _read(module: nn.Module, prefix: str, checkpoint: _Checkpoint, dtype: torch.dtype) -> None:
    """Fill ``module``'s parameters from the checkpoint's ``prefix + name`` tensors."""
    for name, _ in list(module.named_parameters()):
        owner_name, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        setattr(owner, leaf, nn.Parameter(checkpoint.tensor(prefix + name, dtype), requires_grad=False))


def _head_rows(model, checkpoint, name, dtype, quantization, rank, world, comm) -> VocabParallelHead:
    """This rank's rows of the LM head (read as rows: the head is never whole here), quantized as
    `quantize_model` quantizes a head (int8, for int4 too: any shape), padded like `sharding.shard_head`'s."""
    from ..layers.quantized.quantized_linear import Int8WeightOnlyLinear

    vocab = model.config.get_text_config().vocab_size
    start, stop, per_rank = vocab_rows_of(rank, world, vocab)
    read = dense_linear(checkpoint.rows(name, start, stop, dtype), None)  # [stop - start, hidden]
    rows = take_rows(read, [(0, stop - start)], pad_to=per_rank)  # (the last rank's zero rows)
    if quantization:  # per-row scales: the rows' own, as when the whole head is quantized then cut
        rows = Int8WeightOnlyLinear(rows)
    return VocabParallelHead(rows, vocab, comm)
