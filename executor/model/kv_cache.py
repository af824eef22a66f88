"""The paged KV pool of one model: one tensor, pre-allocated from a memory budget."""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class KVCacheSpec:
    """Shape of one model's KV entries."""

    num_layers: int  #: attention layers that own a cache
    num_kv_heads: int  #: key/value heads per layer
    head_dim: int  #: size of one head
    dtype: torch.dtype  #: element type of the pool

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    @classmethod
    def from_model_config(cls, config, dtype: torch.dtype) -> KVCacheSpec:
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        num_heads = text_config.num_attention_heads
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // num_heads
        num_kv_heads = getattr(text_config, "num_key_value_heads", None) or num_heads
        return cls(text_config.num_hidden_layers, num_kv_heads, head_dim, dtype)


def num_blocks_for_budget(spec: KVCacheSpec, block_size: int, memory_bytes: int) -> int:
    return max(memory_bytes // (spec.bytes_per_token * block_size), 1)


class KVCache:
    """``kv[layer, 0 | 1, slot, kv_head, head_dim]``: keys (0) and values (1) for every slot of every page.

    Slots are pages laid end to end (``slot = block * block_size + offset``), so a write is one
    ``index_copy_`` and a read one page gather (`gather_pages`) into a scratch buffer kept across
    layers and forwards (a fresh multi-megabyte tensor per layer costs more in page faults than the copy).
    One page past the ``num_blocks`` the block manager hands out, `padding_block`, belongs to nobody: a
    captured forward's padding tokens write their K/V there and padded block-table entries point at it.
    """

    def __init__(self, spec: KVCacheSpec, num_blocks: int, block_size: int, device: torch.device) -> None:
        self.spec = spec
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.padding_block = num_blocks  #: the page nobody owns (written by padding tokens only)
        num_slots = (num_blocks + 1) * block_size
        # [layers, 2, num_slots, kv_heads, head_dim]
        self.kv = zeroed_pool(
            (spec.num_layers, 2, num_slots, spec.num_kv_heads, spec.head_dim), spec.dtype, device
        )
        # flat; holds [2, pages, page size] of the last page gather, grown on demand
        self._scratch = self.kv.new_empty(0)

    def write(
        self, layer: int, slot_mapping: torch.Tensor | slice, key: torch.Tensor, value: torch.Tensor
    ) -> None:
        """Store new entries. slot_mapping [num_tokens] (or a slice of consecutive slots); key, value
        [num_tokens, kv_heads, head_dim]."""
        if isinstance(slot_mapping, slice):
            self.kv[layer, 0, slot_mapping].copy_(key)
            self.kv[layer, 1, slot_mapping].copy_(value)
            return
        self.kv[layer, 0].index_copy_(0, slot_mapping, key.to(self.spec.dtype))
        self.kv[layer, 1].index_copy_(0, slot_mapping, value.to(self.spec.dtype))

    def view(self, layer: int, slots: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Consecutive slots, read in place: key, value [len(slots), kv_heads, head_dim] (views)."""
        return self.kv[layer, 0, slots], self.kv[layer, 1, slots]

    @property
    def page_numel(self) -> int:
        """Elements of one page of keys (or of values) of one layer."""
        return self.block_size * self.spec.num_kv_heads * self.spec.head_dim

    def gather_numel(self, num_pages: int) -> int:
        """Elements of a buffer `gather_pages` fills from ``num_pages`` pages: their keys and values, and
        one slot's row (kv_heads * head_dim) past them, where `AttentionGroup.stale_rows` sends unused
        entries."""
        return 2 * num_pages * self.page_numel + self.page_numel // self.block_size

    def gather_pages(
        self,
        layer: int,
        block_tables: torch.Tensor,
        buffer: torch.Tensor | None = None,
        stale_rows: torch.Tensor | None = None,
        num_keys: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Read whole pages. block_tables [group, max_blocks]; returns key, value
        [group, num_keys (default: max_blocks * block_size), kv_heads, head_dim], views of ``buffer``
        (flat, at least `gather_numel` of the group's pages; default: a scratch buffer grown on demand)
        that the next gather overwrites (consume them first).
        ``stale_rows`` ([num], `AttentionGroup.stale_rows`: rows of the keys then the values; the row past
        them all is scratch) read as zeros: slots past a request's keys, which may hold a freed page's NaN."""
        group, max_blocks = block_tables.shape
        spec, bs, page = self.spec, self.block_size, self.page_numel
        pages = self.kv[layer].view(2, self.num_blocks + 1, page)  # [2, num_blocks + 1, page]
        wanted = group * max_blocks
        if buffer is None:
            if self._scratch.numel() < self.gather_numel(wanted):
                self._scratch = self.kv.new_empty(self.gather_numel(wanted))
            buffer = self._scratch
        out = buffer[: 2 * wanted * page].view(2, wanted, page)  # [2, group * max_blocks, page]
        torch.index_select(pages, 1, block_tables.reshape(-1), out=out)
        if stale_rows is not None:  # under a page a request (a where over all of it cost 15-50% a layer)
            buffer.view(-1, page // bs).index_fill_(0, stale_rows, 0)  # [rows, kv_heads * head_dim]
        kv = out.view(2, group, max_blocks * bs, spec.num_kv_heads, spec.head_dim)
        if num_keys is not None and num_keys < max_blocks * bs:
            kv = kv[:, :, :num_keys]
        return kv[0], kv[1]


def zeroed_pool(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero-filled tensor. On the CPU it lies in an anonymous memory map, whose pages the OS zeroes on
    first touch: ``torch.zeros`` writes every byte up front (1.4 s for the default 1 GiB pool on a
    loaded 2-core machine), and memory a pool never uses never becomes resident. (Not numpy's
    ``zeros``: it asks for 2 MiB huge pages, so each first touch zeroes 2 MiB, 0.8 ms.) Zeros, not
    garbage: a page gather reads whole pages, and a NaN in a slot no request wrote would reach the
    output through ``0 * NaN``."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    num_bytes = math.prod(shape) * dtype.itemsize
    pages = mmap.mmap(-1, max(num_bytes, 1))  # anonymous: zero-filled; the tensor keeps it alive
    return torch.frombuffer(pages, dtype=torch.uint8)[:num_bytes].view(dtype).view(shape)
