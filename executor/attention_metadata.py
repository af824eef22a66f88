"""Per-forward metadata for paged attention over a ragged batch.

Tokens of all scheduled requests are flattened into one sequence (``[num_tokens]``). Requests with
short queries (decode rows, ``1 + k`` verification rows, small prefill chunks) form one padded group;
each long prefill chunk forms a group of its own, so a 500-token chunk never pads seven decode rows to
500. Everything a layer needs (gather indices, masks) is built once per forward and shared by all layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

#: queries of at most this many tokens share the padded group
MAX_SHORT_QUERY_LEN = 64


@dataclass(slots=True)
class SequenceSlice:
    """One request's part of the flattened batch."""

    query_start: int  #: offset of its first new token in the flat batch
    query_len: int  #: number of new tokens (prefill chunk, or 1 + num draft tokens)
    start_pos: int  #: position of its first new token (= tokens already in the cache)
    block_table: list[int]  #: its pages, in order

    @property
    def kv_len(self) -> int:
        return self.start_pos + self.query_len


@dataclass(slots=True)
class AttentionGroup:
    """Requests attended together in one padded ``scaled_dot_product_attention`` call."""

    query_slice: slice | None  #: contiguous, equal-length queries: a view of the flat batch, else None
    query_index: torch.Tensor  # [group, max_query] flat token index (padding points at token 0)
    num_queries: int  #: group size
    max_query_len: int
    valid_rows: torch.Tensor  # [num_valid] rows of the padded [group * max_query] output that are real
    out_index: torch.Tensor  # [num_valid] flat token index of each real row
    kv_slots: torch.Tensor  # [group, max_kv] cache slot of each key position (padding: a valid slot)
    kv_slice: slice | None  #: a lone request on consecutive pages: its keys are one slice of the pool
    query_pos: torch.Tensor  # [group, max_query, 1] position of each query
    key_pos: torch.Tensor  # [1, 1, max_kv]
    base_mask: torch.Tensor | None  # [group, 1, max_query, max_kv] True = attend; None = attend to all
    max_query_pos: int  #: largest query position in the group
    is_causal: bool  #: a lone sequence with nothing cached before it: plain causal attention (no mask)
    _window_masks: dict[int, torch.Tensor] = field(default_factory=dict)

    def uses_causal_kernel(self, sliding_window: int | None) -> bool:
        """True when SDPA's own causal masking is exact here (no window cuts in): no mask is built."""
        return self.is_causal and (not sliding_window or self.max_query_pos < sliding_window)

    def mask(self, sliding_window: int | None) -> torch.Tensor | None:
        """The mask for a layer; a sliding-window layer sees only keys with ``q_pos - k_pos < window``."""
        if not sliding_window or self.max_query_pos < sliding_window:
            return self.base_mask
        if sliding_window not in self._window_masks:
            in_window = (self.key_pos > self.query_pos - sliding_window).unsqueeze(1)
            base = self.base_mask if self.base_mask is not None else torch.ones_like(in_window)
            self._window_masks[sliding_window] = base & in_window
        return self._window_masks[sliding_window]


def build_group(seqs: list[SequenceSlice], block_size: int, device: torch.device) -> AttentionGroup:
    num = len(seqs)
    max_q = max(s.query_len for s in seqs)
    max_kv = max(s.kv_len for s in seqs)
    q_len = torch.tensor([s.query_len for s in seqs])  # [group]
    q_start = torch.tensor([s.query_start for s in seqs])  # [group]
    start_pos = torch.tensor([s.start_pos for s in seqs])  # [group]
    kv_len = q_len + start_pos  # [group]
    max_blocks = max(len(s.block_table) for s in seqs)
    tables = torch.zeros(num, max_blocks, dtype=torch.long)  # [group, max_blocks]
    for i, s in enumerate(seqs):
        tables[i, : len(s.block_table)] = torch.tensor(s.block_table)

    q_off = torch.arange(max_q)  # [max_q]
    q_valid = q_off[None, :] < q_len[:, None]  # [group, max_q]
    query_index = torch.where(q_valid, q_start[:, None] + q_off[None, :], 0)  # [group, max_q]
    key_pos = torch.arange(max_kv)  # [max_kv]
    block_of_pos = (key_pos // block_size).clamp(max=max_blocks - 1)
    kv_slots = tables[:, block_of_pos] * block_size + key_pos % block_size  # [group, max_kv]
    query_pos = start_pos[:, None] + q_off[None, :]  # [group, max_q]

    causal = key_pos[None, None, :] <= query_pos[:, :, None]  # [group, max_q, max_kv]
    mask = causal & (key_pos[None, None, :] < kv_len[:, None, None])
    # padded query rows attend to key 0 only, so softmax never sees an empty row (their output is dropped)
    mask |= (~q_valid)[:, :, None] & (key_pos == 0)[None, None, :]
    base_mask = None if bool(mask.all()) else mask.unsqueeze(1).to(device)

    uniform = bool((q_len == max_q).all()) and all(
        seqs[i].query_start == seqs[0].query_start + i * max_q for i in range(num)
    )
    query_slice = slice(seqs[0].query_start, seqs[0].query_start + num * max_q) if uniform else None
    kv_slice = _consecutive_slots(seqs[0], block_size) if num == 1 else None
    valid_rows = q_valid.flatten().nonzero().squeeze(1)
    return AttentionGroup(
        query_slice=query_slice,
        query_index=query_index.to(device),
        num_queries=num,
        max_query_len=max_q,
        valid_rows=valid_rows.to(device),
        out_index=query_index.flatten()[valid_rows].to(device),
        kv_slots=kv_slots.to(device),
        kv_slice=kv_slice,
        query_pos=query_pos.unsqueeze(-1).to(device),
        key_pos=key_pos.view(1, 1, -1).to(device),
        base_mask=base_mask,
        max_query_pos=int(query_pos.max()),
        is_causal=num == 1 and seqs[0].start_pos == 0,
    )


def _consecutive_slots(seq: SequenceSlice, block_size: int) -> slice | None:
    """The slots of a request whose pages are consecutive, as one slice; else None."""
    first = seq.block_table[0]
    num_blocks = -(-seq.kv_len // block_size)
    if seq.block_table[:num_blocks] != list(range(first, first + num_blocks)):
        return None
    return slice(first * block_size, first * block_size + seq.kv_len)


#: a padded group may cost at most this much more than its requests' own query x key work
MAX_PADDING_OVERHEAD = 1.5


def group_sequences(seqs: list[SequenceSlice]) -> list[list[SequenceSlice]]:
    """Short queries share padded groups; each long query is alone.

    Short queries are sorted by key length and cut into groups whose padded size (``num * max_q *
    max_kv``) stays within `MAX_PADDING_OVERHEAD` of their real work, so a decode row over 100 keys
    never pads to a neighbour's 1700 keys or to a 60-token prefill chunk. Uniform batches stay one group."""
    short = sorted(
        (s for s in seqs if s.query_len <= MAX_SHORT_QUERY_LEN), key=lambda s: (s.kv_len, s.query_len)
    )
    groups: list[list[SequenceSlice]] = []
    group: list[SequenceSlice] = []
    real = max_q = max_kv = 0
    for s in short:
        q, kv = max(max_q, s.query_len), max(max_kv, s.kv_len)
        if group and (len(group) + 1) * q * kv > MAX_PADDING_OVERHEAD * (real + s.query_len * s.kv_len):
            groups.append(group)
            group, real, q, kv = [], 0, s.query_len, s.kv_len
        group.append(s)
        real += s.query_len * s.kv_len
        max_q, max_kv = q, kv
    if group:
        groups.append(group)
    groups = [sorted(g, key=lambda s: s.query_start) for g in groups]  # batch order: a uniform view
    return groups + [[s] for s in seqs if s.query_len > MAX_SHORT_QUERY_LEN]


@dataclass(slots=True)
class AttentionMetadata:
    """What the paged attention function needs for one forward; passed through the model's ``**kwargs``."""

    kv_cache: object  #: the model's KVCache
    slot_mapping: torch.Tensor | slice  # [num_tokens] cache slot of each new token's K/V (a slice when
    #                                     they are consecutive: one lone request on consecutive pages)
    groups: list[AttentionGroup]
    num_tokens: int
    is_single_view: bool  #: one group whose queries are the whole batch in order: its output is the output

    @classmethod
    def build(cls, kv_cache, slot_mapping: torch.Tensor, seqs: list[SequenceSlice], block_size: int):
        device = slot_mapping.device
        num_tokens = int(slot_mapping.shape[0])
        groups = [build_group(g, block_size, device) for g in group_sequences(seqs)]
        lone = groups[0] if len(groups) == 1 else None
        writes: torch.Tensor | slice = slot_mapping
        if lone is not None and lone.kv_slice is not None:
            writes = slice(lone.kv_slice.stop - num_tokens, lone.kv_slice.stop)
        single = lone is not None and lone.query_slice == slice(0, num_tokens)
        return cls(kv_cache, writes, groups, num_tokens, single)
