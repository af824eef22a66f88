"""One rank's shard of an own-decoder model, Megatron-style.

- q/k/v (one fused ``qkv_proj``): column-parallel by whole KV-head groups, as even as they go
  (`kv_heads_of`: SmolLM2's 3 KV heads over 2 ranks are 2 and 1): each rank holds its KV heads and the
  query heads that attend to them (contiguous, as GQA groups are).
- ``o_proj``: row-parallel over those query heads, then one all-reduce (`RowParallelLinear`).
- gate/up (one fused ``gate_up_proj``): column-parallel over the intermediate size; ``down_proj``:
  row-parallel, one all-reduce.
- The LM head: vocabulary-parallel, the logits all-gathered (`VocabParallelHead`).
- The collectives go through shared memory on one machine (`shm_collectives.py`: 59 us against gloo's
  2.9 ms for a hidden vector among 3 ranks on 2 cores).
- The embedding, the norms and the rotary tables are replicated; each rank's KV cache holds its heads.

Every layer form shards (`weight_slices.py`): dense, int8, int4 and a GGUF's Q4 / Q8_0 codes are sliced
as stored; a slice a quantized kernel cannot hold is held dense (logged). A size above the KV heads
(they are not replicated) or that does not divide the intermediate size is refused, naming them. A
bias of a row-parallel layer is added once, on rank 0.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import replace

import torch
from torch import nn

from ..model.decoder.convert import is_own_decoder
from ..model.kv_cache import KVCacheSpec
from .weight_slices import is_held_dense, is_sliceable, take_columns, take_rows

logger = logging.getLogger("specexec")
SHARDED_LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
ROW_PARALLEL = ("o_proj", "down_proj")


def check_shardable(model: nn.Module, world: int) -> None:
    """Raise ValueError unless ``world`` ranks can split this model (see the module doc)."""
    if not is_own_decoder(model):
        raise ValueError(
            "tensor_parallel_size > 1 needs specexec's own decoder (model_impl: auto or specexec on a "
            f"Llama-family model); {type(model).__name__} runs on transformers' modules"
        )
    for i, layer in enumerate(model.model.layers):
        for name in SHARDED_LINEARS:
            if not is_sliceable(getattr(layer, name)):
                kind = type(getattr(layer, name)).__name__
                raise ValueError(f"tensor parallelism cannot slice layer {i}'s {name} (a {kind})")
        spec, inter = layer.spec, layer.down_proj.in_features
        if spec.num_kv_heads < world or inter % world:
            counts = (
                f"{spec.num_heads} attention heads, {spec.num_kv_heads} KV heads, {inter} intermediate size"
            )
            raise ValueError(
                f"tensor_parallel_size {world} cannot split this model ({counts}): each rank needs at "
                "least one whole KV-head group (KV heads are not replicated) and an equal share of the "
                "intermediate size"
            )
    if not is_sliceable(model.lm_head):
        raise ValueError(f"tensor parallelism cannot slice the LM head (a {type(model.lm_head).__name__})")


def kv_heads_of(rank: int, world: int, num_kv_heads: int) -> tuple[int, int]:
    """Rank ``rank``'s KV heads ``[start, stop)``: whole KV-head groups, as even as they go (the first
    ``num_kv_heads % world`` ranks hold one more)."""
    base, extra = divmod(num_kv_heads, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def vocab_rows_of(rank: int, world: int, vocab: int) -> tuple[int, int, int]:
    """Rank ``rank``'s LM-head rows ``[start, stop)``, and the rows every rank holds (the last rank's
    padded with zero rows up to them: their logits are cut off)."""
    per_rank = -(-vocab // world)
    return rank * per_rank, min(vocab, (rank + 1) * per_rank), per_rank


def rank_kv_spec(spec: KVCacheSpec, world: int, rank: int) -> KVCacheSpec:
    """Rank ``rank``'s KV cache: its KV heads only, on the same pages."""
    start, stop = kv_heads_of(rank, world, spec.num_kv_heads)
    return KVCacheSpec(spec.num_layers, stop - start, spec.head_dim, spec.dtype)


class RowParallelLinear(nn.Module):
    """``x [T, in/N] -> [T, out]``: this rank's input columns of a layer (any form `weight_slices`
    makes), summed over the ranks through ``comm`` (`shm_collectives.ShmCollectives`)."""

    def __init__(self, local: nn.Module, comm) -> None:
        super().__init__()
        self.local = local  # [in / N] -> [out]; its bias on rank 0 only
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(self.local(x).contiguous())  # [T, out]


class VocabParallelHead(nn.Module):
    """``x [R, hidden] -> [R, vocab]``: this rank's rows of the LM head, the ranks' logits gathered."""

    def __init__(self, local: nn.Module, vocab_size: int, comm) -> None:
        super().__init__()
        self.local = local  # [hidden] -> [vocab / N (padded)]
        self.vocab_size = vocab_size
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = self.local(x).contiguous()  # [R, vocab / N]
        return self.comm.all_gather(local)[:, : self.vocab_size]  # [R, vocab]


@torch.no_grad()
def shard_model(model: nn.Module, rank: int, world: int, comm) -> nn.Module:
    """A copy of ``model`` holding rank ``rank``'s slices of every sharded layer (see the module doc),
    its collectives through ``comm``; ``check_shardable`` first. The sharded layers are not copied whole
    on the way: only their slices are made."""
    sharded = [getattr(layer, name) for layer in model.model.layers for name in SHARDED_LINEARS]
    # the sharded layers are not copied (their slices replace them); nor is the head, which stays the
    # source's own where anything else refers to it (an embedding looked up in a tied head's codes,
    # `quantized_embedding.py`: every rank holds the whole table) and is replaced by its rows here
    memo = {id(m): None for m in sharded} | {id(model.lm_head): model.lm_head}
    shard = copy.deepcopy(model, memo=memo)
    held_dense = []
    for source, layer in zip(model.model.layers, shard.model.layers, strict=True):
        held_dense += shard_layer(source, layer, rank, world, comm)
    shard.lm_head, head_dense = shard_head(model.lm_head, rank, world, comm)
    report_held_dense(held_dense + (["lm_head"] if head_dense else []), rank)
    return shard


@torch.no_grad()
def shard_layer(source: nn.Module, layer: nn.Module, rank: int, world: int, comm) -> list[str]:
    """Give ``layer`` (a copy of the decoder layer ``source``, or ``source`` itself) rank ``rank``'s
    slices of ``source``'s sharded linear layers and its share of the heads; the names of the slices
    held dense."""
    spec = source.spec
    d, group = spec.head_dim, spec.num_heads // spec.num_kv_heads  # query heads per KV head
    kv_start, kv_stop = kv_heads_of(rank, world, spec.num_kv_heads)
    kv, heads = kv_stop - kv_start, (kv_stop - kv_start) * group
    q_start, q_size, kv_size = kv_start * group * d, spec.num_heads * d, spec.num_kv_heads * d
    qkv = [
        (q_start, q_start + heads * d),
        (q_size + kv_start * d, q_size + kv_stop * d),
        (q_size + kv_size + kv_start * d, q_size + kv_size + kv_stop * d),
    ]
    inter = source.down_proj.in_features
    part = inter // world
    gate_up = [(rank * part, (rank + 1) * part), (inter + rank * part, inter + (rank + 1) * part)]
    slices = {
        "qkv_proj": take_rows(source.qkv_proj, qkv),
        "o_proj": take_columns(source.o_proj, q_start, q_start + heads * d, rank == 0),
        "gate_up_proj": take_rows(source.gate_up_proj, gate_up),
        "down_proj": take_columns(source.down_proj, rank * part, (rank + 1) * part, rank == 0),
    }
    held_dense = [name for name, sliced in slices.items() if is_held_dense(getattr(source, name), sliced)]
    for name, sliced in slices.items():
        setattr(layer, name, RowParallelLinear(sliced, comm) if name in ROW_PARALLEL else sliced)
    layer.spec = replace(spec, num_heads=heads, num_kv_heads=kv)
    layer._split = (heads * d, kv * d)
    return held_dense


@torch.no_grad()
def shard_head(head: nn.Module, rank: int, world: int, comm) -> tuple[VocabParallelHead, bool]:
    """Rank ``rank``'s rows of the LM head (the last rank's padded with zero rows), and whether they
    are held dense."""
    start, stop, per_rank = vocab_rows_of(rank, world, head.out_features)
    rows = take_rows(head, [(start, stop)], pad_to=per_rank)
    return VocabParallelHead(rows, head.out_features, comm), is_held_dense(head, rows)


def report_held_dense(names: list[str], rank: int) -> None:
    if names and rank == 0:
        logger.info(
            "tensor parallelism: %d slices of quantized layers held dense (%s): their kernels cannot "
            "hold the slice's shape",
            len(names),
            ", ".join(sorted(set(names))),
        )
