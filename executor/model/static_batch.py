"""The input buffers of a captured forward and the one write per step that fills them.

A captured forward of shape ``(B, Q, NB)`` (`graph_shapes.py`) reads a flat batch of ``B * Q`` tokens
laid out sequence after sequence, ``Q`` slots each: sequence ``i``'s new tokens sit at ``i * Q ..``,
the rest of its slots and every slot of a padding sequence are *padding tokens*. A padding token has id
0 and position 0, writes its K/V into the KV cache's `padding_block` (a page nobody owns), and its query
row attends to one key only; its logits and hidden states are never read. Block tables are padded with
the padding page too. So the real sequences' tokens, pages and outputs are exactly an eager forward's.

Every buffer of every shape is a view of one device tensor of longs, filled by one copy per step from a
pinned host twin. The attention masks are derived on the device from those integers (`metadata`), so a
graph captured over `metadata` and the model call replays them for any step of its shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention_metadata import MAX_SHORT_QUERY_LEN, AttentionGroup, AttentionMetadata, causal_page_mask
from .attention_paths import AttentionPaths
from .forward_io import SequenceInput
from .graph_shapes import GraphShape
from .kv_cache import KVCache

#: max_query_pos of a captured group: unknown at capture, so every sliding window is applied
UNKNOWN_POSITION = 2**63 - 1
#: the long fields of a shape, in buffer order, with their length in (B, Q, NB) terms
FIELDS = (
    "input_ids",
    "positions",
    "slot_mapping",
    "query_len",
    "start_pos",
    "block_tables",
    "rows",
    "tokens",
)


def _field_sizes(shape: GraphShape) -> tuple[int, ...]:
    b, t = shape.num_seqs, shape.num_tokens
    return (t, t, t, b, b, b * shape.num_blocks, t, t)


@dataclass(slots=True)
class StaticViews:
    """One shape's views of the input buffer (fixed addresses: what its graph reads)."""

    shape: GraphShape
    input_ids: torch.Tensor  # [B * Q] long
    positions: torch.Tensor  # [B * Q] long
    slot_mapping: torch.Tensor  # [B * Q] long, padding tokens: a slot of the padding page
    query_len: torch.Tensor  # [B] real new tokens of each sequence (0: a padding sequence)
    start_pos: torch.Tensor  # [B] position of each sequence's first new token
    block_tables: torch.Tensor  # [B, NB] pages (padded with the padding page)
    rows: torch.Tensor  # [B * Q] flat index of each logit row wanted, in step order (first num_rows)
    tokens: torch.Tensor  # [B * Q] flat index of each real token, in step order (first num_tokens)


@dataclass(slots=True)
class StepLayout:
    """What one step wrote: how many real logit rows and tokens to read back, and their offsets."""

    shape: GraphShape
    num_rows: int
    num_tokens: int
    cu_rows: list[int]  # [batch + 1]
    cu_tokens: list[int]  # [batch + 1]


class StaticInputs:
    """The input buffers every captured shape of one model reads (sized for its largest shape), and the
    buffer its attention gathers pages into (a graph's own: the KV cache's scratch may be reallocated)."""

    def __init__(self, kv_cache: KVCache, largest: GraphShape) -> None:
        self.kv_cache = kv_cache
        self.device = kv_cache.kv.device
        self.largest = largest  #: the shape the buffers are sized for (it bounds every other one)
        size = sum(_field_sizes(largest))
        is_cuda = self.device.type == "cuda"
        self._device_ints = torch.zeros(size, dtype=torch.long, device=self.device)  # [size]
        self._host_ints = torch.zeros(size, dtype=torch.long, pin_memory=is_cuda)  # [size], pinned on CUDA
        # the last copy out of the host buffer: waited for before the buffer is written again
        self._copied = torch.cuda.Event() if is_cuda else None
        # (with the row past it where `last_page_stale_rows` sends its unused entries)
        self.gather_buffer = kv_cache.kv.new_empty(
            kv_cache.gather_numel(largest.num_seqs * largest.num_blocks)
        )

    def views(self, shape: GraphShape) -> StaticViews:
        parts = self._device_ints[: sum(_field_sizes(shape))].split(_field_sizes(shape))
        fields = dict(zip(FIELDS, parts))
        fields["block_tables"] = fields["block_tables"].view(shape.num_seqs, shape.num_blocks)
        return StaticViews(shape, **fields)

    def write(self, seqs: list[SequenceInput], shape: GraphShape) -> StepLayout:
        """Lay the step's sequences out in ``shape`` (padding around them) with one host-to-device copy."""
        b, q, nb = shape.num_seqs, shape.query_len, shape.num_blocks
        bs = self.kv_cache.block_size
        pad_block = self.kv_cache.padding_block
        ids, positions, slots = [0] * (b * q), [0] * (b * q), [pad_block * bs] * (b * q)
        query_len, start_pos, tables = [0] * b, [0] * b, [pad_block] * (b * nb)
        rows: list[int] = []
        tokens: list[int] = []
        cu_rows, cu_tokens = [0], [0]
        if len(seqs) > b:
            raise ValueError(f"{len(seqs)} sequences do not fit a captured shape of {b}")
        for i, seq in enumerate(seqs):
            n, base, start, table = len(seq.token_ids), i * q, seq.start_pos, seq.block_table
            if n > q or start + n > nb * bs:
                raise ValueError(f"a sequence of {n} new tokens at {start} does not fit the shape {shape}")
            ids[base : base + n] = seq.token_ids
            positions[base : base + n] = range(start, start + n)
            slots[base : base + n] = [table[p // bs] * bs + p % bs for p in range(start, start + n)]
            query_len[i], start_pos[i] = n, start
            used = table[: -(-(start + n) // bs)]  # the pages of its keys (one taken ahead may hold NaN)
            tables[i * nb : i * nb + len(used)] = used
            rows.extend(range(base + n - seq.num_logit_rows, base + n))
            tokens.extend(range(base, base + n))
            cu_rows.append(len(rows))
            cu_tokens.append(len(tokens))
        values = [
            *ids, *positions, *slots, *query_len, *start_pos, *tables,
            *rows, *[0] * (b * q - len(rows)), *tokens, *[0] * (b * q - len(tokens)),
        ]  # fmt: skip
        n = len(values)
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copy has left the host buffer
        self._host_ints[:n].copy_(torch.tensor(values, dtype=torch.long))
        self._device_ints[:n].copy_(self._host_ints[:n], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        return StepLayout(shape, len(rows), len(tokens), cu_rows, cu_tokens)

    def metadata(self, views: StaticViews, paths: AttentionPaths) -> AttentionMetadata:
        """The attention metadata of a shape, its masks derived on the device from the views (run inside
        the captured region, so every replay derives them from that step's integers)."""
        shape, bs = views.shape, self.kv_cache.block_size
        max_kv = shape.num_blocks * bs
        q_off = torch.arange(shape.query_len, device=self.device)  # [Q]
        q_valid = q_off[None, :] < views.query_len[:, None]  # [B, Q]
        query_pos = views.start_pos[:, None] + q_off[None, :]  # [B, Q]
        key_pos = torch.arange(max_kv, device=self.device)  # [max_kv]
        kv_len = views.query_len + views.start_pos  # [B]
        group = AttentionGroup(
            query_slice=slice(0, shape.num_tokens),
            query_index=None,
            num_queries=shape.num_seqs,
            max_query_len=shape.query_len,
            valid_rows=None,
            out_index=None,
            block_tables=views.block_tables,
            kv_slice=None,
            max_kv_len=max_kv,
            query_pos=query_pos.unsqueeze(-1),
            kv_lens=kv_len,
            key_pos=key_pos.view(1, 1, -1),
            base_mask=causal_page_mask(q_valid, query_pos, key_pos, kv_len),
            max_query_pos=UNKNOWN_POSITION,
            is_causal=False,
            is_short=shape.query_len <= MAX_SHORT_QUERY_LEN,
            has_stale_slots=True,  # (the lengths are the step's: every last page may have some)
        )
        return AttentionMetadata(
            self.kv_cache, views.slot_mapping, [group], shape.num_tokens, True, paths, self.gather_buffer
        )
