"""One rank's shard of an own-decoder model, Megatron-style.

- q/k/v (one fused ``qkv_proj``): column-parallel by whole KV-head groups: rank r holds KV heads
  ``[r * kv/N, (r + 1) * kv/N)`` and the query heads that attend to them (contiguous, as GQA groups are).
- ``o_proj``: row-parallel over those query heads, then one all-reduce (`RowParallelLinear`).
- gate/up (one fused ``gate_up_proj``): column-parallel over the intermediate size; ``down_proj``:
  row-parallel, one all-reduce.
- The LM head: vocabulary-parallel, the logits all-gathered (`VocabParallelHead`).
- The collectives go through shared memory on one machine (`shm_collectives.py`: 59 us against gloo's
  2.9 ms for a hidden vector among 3 ranks on 2 cores).
- The embedding, the norms and the rotary tables are replicated; each rank's KV cache holds its heads.

A size that does not divide the heads, the KV heads and the intermediate size is refused, naming them
(uneven splits are not built). A bias of a row-parallel layer is added once, on rank 0.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from ..model.decoder.convert import is_own_decoder


def check_shardable(model: nn.Module, world: int) -> None:
    """Raise ValueError unless ``world`` ranks can split this model evenly."""
    if not is_own_decoder(model):
        raise ValueError(
            "tensor_parallel_size > 1 needs specexec's own decoder (model_impl: auto or specexec on a "
            f"Llama-family model); {type(model).__name__} runs on transformers' modules"
        )
    for i, layer in enumerate(model.model.layers):
        if type(layer.qkv_proj) is not nn.Linear or type(layer.down_proj) is not nn.Linear:
            raise ValueError(
                f"tensor_parallel_size > 1 shards dense layers only; layer {i}'s are "
                f"{type(layer.qkv_proj).__name__} (quantized weights are not sharded yet)"
            )
        spec = layer.spec
        sizes = {
            "attention heads": spec.num_heads,
            "KV heads": spec.num_kv_heads,
            "intermediate size": layer.down_proj.in_features,
        }
        uneven = {name: n for name, n in sizes.items() if n % world}
        if uneven:
            counts = ", ".join(f"{n} {name}" for name, n in sizes.items())
            raise ValueError(
                f"tensor_parallel_size {world} does not divide this model ({counts}); choose a size "
                "that divides each (uneven splits are not built)"
            )


class RowParallelLinear(nn.Module):
    """``x [T, in/N] -> [T, out]``: this rank's columns of the weight, summed over the ranks through
    ``comm`` (`shm_collectives.ShmCollectives`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, comm) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [out, in / N]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)  # [out] (rank 0)
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(F.linear(x, self.weight, self.bias))  # [T, out]


class VocabParallelHead(nn.Module):
    """``x [R, hidden] -> [R, vocab]``: this rank's rows of the LM head, the ranks' logits gathered."""

    def __init__(self, weight: torch.Tensor, vocab_size: int, comm) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [vocab / N (padded), hidden]
        self.vocab_size = vocab_size
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x, self.weight).contiguous()  # [R, vocab / N]
        return self.comm.all_gather(local)[:, : self.vocab_size]  # [R, vocab]


def _rows(weight: torch.Tensor, ranges: list[tuple[int, int]]) -> torch.Tensor:
    return torch.cat([weight[a:b] for a, b in ranges]).contiguous()


@torch.no_grad()
def shard_model(model: nn.Module, rank: int, world: int, comm) -> nn.Module:
    """A copy of ``model`` holding rank ``rank``'s slices of every sharded layer (see the module doc),
    its collectives through ``comm``; ``check_shardable`` first."""
    shard = copy.deepcopy(model)
    for layer in shard.model.layers:
        spec = layer.spec
        d, heads, kv = spec.head_dim, spec.num_heads // world, spec.num_kv_heads // world
        q_size, kv_size = spec.num_heads * d, spec.num_kv_heads * d
        qkv = [
            (rank * heads * d, (rank + 1) * heads * d),
            (q_size + rank * kv * d, q_size + (rank + 1) * kv * d),
            (q_size + kv_size + rank * kv * d, q_size + kv_size + (rank + 1) * kv * d),
        ]
        layer.qkv_proj = _column_linear(layer.qkv_proj, qkv)
        layer.o_proj = _row_linear(layer.o_proj, rank * heads * d, (rank + 1) * heads * d, rank, comm)
        inter = layer.down_proj.in_features
        part = inter // world
        gate_up = [(rank * part, (rank + 1) * part), (inter + rank * part, inter + (rank + 1) * part)]
        layer.gate_up_proj = _column_linear(layer.gate_up_proj, gate_up)
        layer.down_proj = _row_linear(layer.down_proj, rank * part, (rank + 1) * part, rank, comm)
        layer.spec = replace(spec, num_heads=heads, num_kv_heads=kv)
        layer._split = (heads * d, kv * d)
    head = shard.lm_head.weight  # [vocab, hidden]
    vocab = head.shape[0]
    per_rank = -(-vocab // world)
    rows = head[rank * per_rank : (rank + 1) * per_rank]
    if rows.shape[0] < per_rank:  # the last rank's rows padded with zeros (their logits are cut off)
        rows = torch.cat([rows, rows.new_zeros(per_rank - rows.shape[0], rows.shape[1])])
    shard.lm_head = VocabParallelHead(rows.contiguous(), vocab, comm)
    return shard


def _column_linear(linear: nn.Linear, ranges: list[tuple[int, int]]) -> nn.Linear:
    weight = _rows(linear.weight, ranges)  # [sum of the ranges, in]
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=linear.bias is not None, device="meta")
    out.weight = nn.Parameter(weight, requires_grad=False)
    if linear.bias is not None:
        out.bias = nn.Parameter(_rows(linear.bias, ranges), requires_grad=False)
    return out


def _row_linear(linear: nn.Linear, start: int, stop: int, rank: int, comm) -> RowParallelLinear:
    bias = linear.bias.clone() if linear.bias is not None and rank == 0 else None
    return RowParallelLinear(linear.weight[:, start:stop].contiguous(), bias, comm)
