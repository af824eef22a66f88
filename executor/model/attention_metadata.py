"""Per-forward metadata for paged attention over a ragged batch, built once and shared by all layers.

Tokens of all scheduled requests are flattened into one sequence (``[num_tokens]``). Requests with
short queries (decode rows, ``1 + k`` verification rows, small prefill chunks) form one padded group;
each long prefill chunk forms a group of its own, so a 500-token chunk never pads seven decode rows to
500.

Everything is decided from the host's own integers (query lengths, positions, block tables), never by
reading a device tensor back: the integers of a group travel to the device in one copy and the masks
are built there, so no forward waits on the device before its first layer. Keys are read page by page
through the block table (``[group, max_blocks]``), so a group's key length is a whole number of pages.
A captured forward (`static_batch.py`) builds the same group from its fixed-shape input buffers, with
the masks derived on the device by `causal_page_mask`.

A slot past a request's keys holds whatever was there before: a freed page keeps its last owner's K/V (a
failed request's NaN) and a rejected draft's K/V stay past the rewound length. The torch kernels read
whole pages, and a masked key still weighs in as 0 * value (NaN for a NaN or Inf value; SDPA adds its
-inf mask to a NaN key's score: NaN), so no such slot may reach them: a request's table is cut to its own
pages and padded with the KV cache's padding page (zeros, or padding tokens' K/V), a gather is read up to
the longest request's keys only, and a shorter request's slots past its keys in its last page are zeroed
in the gathered copy (`AttentionGroup.stale_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .attention_paths import AttentionPaths

#: queries of at most this many tokens share the padded group
MAX_SHORT_QUERY_LEN = 64


@dataclass(slots=True)
class SequenceSlice:
    """One request's part of the flattened batch."""

    query_start: int  #: offset of its first new token in the flat batch
    query_len: int  #: number of new tokens (prefill chunk, or 1 + num draft tokens)
    start_pos: int  #: position of its first new token (= tokens already in the cache)
    block_table: list[int]  #: its pages, in order
    #: a token tree's rows: per new token, the new tokens it attends as bits (`tree_shape.row_ancestor_bits`);
    #: None: causal (every new token before it)
    tree_bits: list[int] | None = None

    @property
    def kv_len(self) -> int:
        return self.start_pos + self.query_len


@dataclass(slots=True)
class AttentionGroup:
    """Requests attended together in one padded attention call."""

    query_slice: slice | None  #: contiguous, equal-length queries: a view of the flat batch, else None
    query_index: torch.Tensor | None  # [group, max_query] flat token index (padding points at token 0);
    #                                   None with a query_slice
    num_queries: int  #: group size (padded rows included)
    max_query_len: int
    valid_rows: torch.Tensor | None  # [num_valid] rows of the padded [group * max_query] output that are
    #                                  real (None: the group's output is the whole batch's)
    out_index: torch.Tensor | None  # [num_valid] flat token index of each real row (None: likewise)
    block_tables: torch.Tensor  # [group, max_blocks] pages of each request (padding: the padding page)
    kv_slice: slice | None  #: a lone request on consecutive pages: its keys are one slice of the pool
    max_kv_len: int  #: keys each request's attention reads: the longest one's (a captured group: all pages)
    query_pos: torch.Tensor  # [group, max_query, 1] position of each query
    kv_lens: torch.Tensor  # [group] keys each request holds (its cached and new tokens)
    key_pos: torch.Tensor  # [1, 1, max_kv]
    base_mask: torch.Tensor | None  # [group, 1, max_query, max_kv] True = attend; None = attend to all
    max_query_pos: int  #: largest query position in the group (a captured group: unknown, so the
    #                     largest int64, and every sliding window is applied)
    is_causal: bool  #: a lone sequence with nothing cached before it: plain causal attention (no mask)
    is_short: bool  #: decode / verify rows (the measured short-query attention path applies)
    has_stale_slots: bool  #: a page gather reads slots past a shorter request's keys (captured: may)
    host_kv_lens: list[int] | None = None  #: `kv_lens` as the host's integers (None: a captured group's)
    #: [group, max_query] a step verifying token trees: the new keys each query attends, as bits (-1: all
    #: of them, causally); None: no tree in the group
    tree_bits: torch.Tensor | None = None
    #: [group, max_query, 1] a tree group's query positions for its sliding window: the root's plus each
    #: node's depth (`query_pos` holds their slots, which run past them); None: `query_pos`
    window_query_pos: torch.Tensor | None = None
    _window_masks: dict[int, torch.Tensor] = field(default_factory=dict)
    _stale_rows: torch.Tensor | None = None

    def uses_causal_kernel(self, sliding_window: int | None) -> bool:
        """True when SDPA's own causal masking is exact here (no window cuts in): no mask is built."""
        return self.is_causal and (not sliding_window or self.max_query_pos < sliding_window)

    def mask(self, sliding_window: int | None) -> torch.Tensor | None:
        """The mask for a layer; a sliding-window layer sees only keys with ``q_pos - k_pos < window``.
        Window masks are built on the first layer that asks and reused by the others."""
        if not sliding_window or self.max_query_pos < sliding_window:
            return self.base_mask
        if sliding_window not in self._window_masks:
            at = self.window_query_pos if self.window_query_pos is not None else self.query_pos
            in_window = (self.key_pos > at - sliding_window).unsqueeze(1)
            base = self.base_mask if self.base_mask is not None else torch.ones_like(in_window)
            self._window_masks[sliding_window] = base & in_window
        return self._window_masks[sliding_window]

    def stale_rows(self, block_size: int) -> torch.Tensor | None:
        """The rows of a page gather to zero (`stale_gather_rows`; a captured group's in a fixed size,
        `last_page_stale_rows`), or None. Built on the first layer that gathers and reused by the others:
        a group on an in-place kernel never asks, so costs nothing."""
        if self.has_stale_slots and self._stale_rows is None:
            max_blocks = self.block_tables.shape[1]
            if self.host_kv_lens is None:
                self._stale_rows = last_page_stale_rows(self.kv_lens, max_blocks, block_size)
            else:
                rows = torch.tensor(stale_gather_rows(self.host_kv_lens, max_blocks * block_size, block_size))
                self._stale_rows = rows.to(self.kv_lens.device, non_blocking=True)
        return self._stale_rows


def build_group(
    seqs: list[SequenceSlice], block_size: int, device: torch.device, padding_page: int
) -> AttentionGroup:
    num = len(seqs)
    q_lens = [s.query_len for s in seqs]
    kv_lens = [s.kv_len for s in seqs]
    is_short = max(q_lens) <= MAX_SHORT_QUERY_LEN
    kv_slice = _consecutive_slots(seqs[0], block_size) if num == 1 else None
    max_q = max(q_lens)
    num_pages = [-(-kv // block_size) for kv in kv_lens]
    max_blocks = max(num_pages)
    max_kv = max(kv_lens)  # a gather reads whole pages, attention only this far (a lone one: its own keys)
    # a shorter request's last page goes on past its keys (a request as long as max_kv: read no further)
    has_stale_slots = kv_slice is None and any(kv % block_size and kv < max_kv for kv in kv_lens)

    # One host buffer, one copy to the device: per request [query_start, query_len, start_pos, table...],
    # the table cut to the pages holding its keys (a page taken ahead may hold a freed page's NaN)
    own_pages = [s.block_table[:n] for s, n in zip(seqs, num_pages)]
    rows = [
        [s.query_start, s.query_len, s.start_pos, *pages] + [padding_page] * (max_blocks - len(pages))
        for s, pages in zip(seqs, own_pages)
    ]
    valid = [g * max_q + j for g, n in enumerate(q_lens) for j in range(n)]
    out_index = [s.query_start + j for s in seqs for j in range(s.query_len)]
    has_tree = any(s.tree_bits is not None for s in seqs)
    bits = [b for s in seqs for b in _padded_bits(s, max_q)] if has_tree else []
    offsets = [j for _ in seqs for j in range(max_q)] if has_tree else []
    row_depths = [_row_depth(b, j) for b, j in zip(bits, offsets)]
    host = torch.tensor(
        [x for row in rows for x in row] + valid + out_index + bits + row_depths, dtype=torch.long
    )
    packed = host.to(device, non_blocking=True)
    ints = packed[: num * (3 + max_blocks)].view(num, 3 + max_blocks)
    q_start, q_len, start_pos = ints[:, 0], ints[:, 1], ints[:, 2]  # [group] each
    tables = ints[:, 3:]  # [group, max_blocks]
    after_tables = num * (3 + max_blocks)
    valid_rows = packed[after_tables:][: len(valid)]  # [num_valid]
    out_rows = packed[after_tables + len(valid) :][: len(out_index)]  # [num_valid]
    after_rows = after_tables + 2 * len(valid)
    tree_bits = packed[after_rows : after_rows + len(bits)].view(num, max_q) if has_tree else None
    tree_depths = packed[after_rows + len(bits) :].view(num, max_q) if has_tree else None  # [group, max_q]

    q_off = torch.arange(max_q, device=device)  # [max_q]
    q_valid = q_off[None, :] < q_len[:, None]  # [group, max_q]
    query_index = torch.where(q_valid, q_start[:, None] + q_off[None, :], 0)  # [group, max_q]
    query_pos = start_pos[:, None] + q_off[None, :]  # [group, max_q]
    window_query_pos = None
    if tree_bits is not None:  # [group, max_q, 1]
        window_query_pos = (start_pos[:, None] + tree_depths).unsqueeze(-1)
    key_pos = torch.arange(max_kv, device=device)  # [max_kv]

    # A mask is needed unless every real query sees every key read: one query per request, all of the
    # same length, exactly filling what is read.
    needs_mask = has_tree or not (max_q == 1 and all(kv == max_kv for kv in kv_lens))
    kv_lens = q_len + start_pos  # [group]
    base_mask = causal_page_mask(q_valid, query_pos, key_pos, kv_lens) if needs_mask else None
    if tree_bits is not None:
        base_mask &= tree_page_mask(tree_bits, start_pos, key_pos)

    uniform = all(n == max_q for n in q_lens) and all(
        seqs[i].query_start == seqs[0].query_start + i * max_q for i in range(num)
    )
    query_slice = slice(seqs[0].query_start, seqs[0].query_start + num * max_q) if uniform else None
    return AttentionGroup(
        query_slice=query_slice,
        query_index=query_index,
        num_queries=num,
        max_query_len=max_q,
        valid_rows=valid_rows,
        out_index=out_rows,
        block_tables=tables,
        kv_slice=kv_slice,
        max_kv_len=max_kv,
        query_pos=query_pos.unsqueeze(-1),
        kv_lens=kv_lens,
        key_pos=key_pos.view(1, 1, -1),
        base_mask=base_mask,
        max_query_pos=max(s.start_pos + s.query_len - 1 for s in seqs),
        is_causal=num == 1 and seqs[0].start_pos == 0 and not has_tree,
        is_short=is_short,
        has_stale_slots=has_stale_slots,
        host_kv_lens=kv_lens,
        tree_bits=tree_bits,
        window_query_pos=window_query_pos,
    )


def _padded_bits(seq: SequenceSlice, max_q: int) -> list[int]:
    """A request's row of the group's tree bits: its own (a tree), else -1 (causal), padded with -1."""
    own = seq.tree_bits if seq.tree_bits is not None else [-1] * seq.query_len
    return own + [-1] * (max_q - len(own))


def _row_depth(bits: int, offset: int) -> int:
    """A tree row's depth (the root's 0) from its ancestor bits: the rows it attends less itself; a causal
    row (-1) at ``offset`` in its query sits that deep."""
    return offset if bits == -1 else (bits & ((1 << 64) - 1)).bit_count() - 1


def tree_page_mask(
    tree_bits: torch.Tensor,  # [group, max_q] the new keys each query attends, as bits
    start_pos: torch.Tensor,  # [group] the position (and slot) of each request's first new token
    key_pos: torch.Tensor,  # [max_kv]
) -> torch.Tensor:  # [group, 1, max_q, max_kv] True = attend
    """The keys a token tree's rows may attend: every cached key, and of the step's new keys a row's own
    ancestors (`sampling/tree_shape.row_ancestor_bits`); ANDed with the causal mask."""
    rel = key_pos[None, :] - start_pos[:, None]  # [group, max_kv]
    bit = (tree_bits[:, :, None] >> rel.clamp(0, 63)[:, None, :]) & 1  # [group, max_q, max_kv]
    return ((rel < 0)[:, None, :] | (rel > 63)[:, None, :] | (bit == 1)).unsqueeze(1)


def stale_gather_rows(kv_lens: list[int], gathered: int, block_size: int) -> list[int]:
    """Rows of a group's page gather (``gathered`` slots a request, kv_heads * head_dim each: the keys,
    then as many values) past a request's keys in its last page, up to the longest request's keys."""
    max_kv, rows = max(kv_lens), []
    for values in (0, len(kv_lens) * gathered):
        for g, kv in enumerate(kv_lens):
            start = values + g * gathered
            rows.extend(range(start + kv, start + min(-(-kv // block_size) * block_size, max_kv)))
    return rows


def last_page_stale_rows(
    kv_lens: torch.Tensor,  # [group] keys each request holds
    max_blocks: int,
    block_size: int,
) -> torch.Tensor:  # [2 * group * block_size]
    """`stale_gather_rows` in a fixed size, derived on the device (a captured forward derives them inside
    its graph, from the step's lengths): each request's last page slot by slot, the slots holding its keys
    sent to the scratch row just past the gather (a padding sequence, holding none: all of its first page)."""
    device = kv_lens.device
    num_rows = kv_lens.shape[0] * max_blocks * block_size  # the gather's keys (its values follow)
    last = (kv_lens - 1).clamp(min=0) // block_size  # [group]
    pos = last[:, None] * block_size + torch.arange(block_size, device=device)  # [group, block_size]
    rows = torch.arange(kv_lens.shape[0], device=device)[:, None] * max_blocks * block_size + pos
    rows = torch.where(pos >= kv_lens[:, None], rows, 2 * num_rows).view(-1)
    return torch.cat([rows, rows + num_rows]).clamp_(max=2 * num_rows)  # keys', then values'


def causal_page_mask(
    q_valid: torch.Tensor,  # [group, max_q] True for a real query (False: padding)
    query_pos: torch.Tensor,  # [group, max_q] position of each query
    key_pos: torch.Tensor,  # [max_kv] position of each key read
    kv_len: torch.Tensor,  # [group] keys each request holds (its cached and new tokens)
) -> torch.Tensor:  # [group, 1, max_q, max_kv] True = attend
    """Each real query attends to the keys at or before its position that its request holds; a padded
    query row attends to key 0 only, so softmax never sees an empty row (its output is dropped).
    Device tensors in, device mask out: a captured forward derives it inside its graph."""
    mask = (key_pos[None, None, :] <= query_pos[:, :, None]) & (
        key_pos[None, None, :] < kv_len[:, None, None]
    )
    mask |= (~q_valid)[:, :, None] & (key_pos == 0)[None, None, :]
    return mask.unsqueeze(1)


def _consecutive_slots(seq: SequenceSlice, block_size: int) -> slice | None:
    """The slots of a request whose pages are consecutive, as one slice; else None."""
    first = seq.block_table[0]
    num_blocks = -(-seq.kv_len // block_size)
    if seq.block_table[:num_blocks] != list(range(first, first + num_blocks)):
        return None
    return slice(first * block_size, first * block_size + seq.kv_len)


#: a padded group may cost at most this much more than its requests' own query x key work
MAX_PADDING_OVERHEAD = 1.5


def group_sequences(seqs: list[SequenceSlice], one_short_group: bool = False) -> list[list[SequenceSlice]]:
    """Short queries share padded groups; each long query is alone.

    Short queries are sorted by key length and cut into groups whose padded size (``num * max_q *
    max_kv``) stays within `MAX_PADDING_OVERHEAD` of their real work, so a decode row over 100 keys
    never pads to a neighbour's 1700 keys or to a 60-token prefill chunk. Uniform batches stay one group.
    With ``one_short_group`` (the attention kernel reads each request's own keys from the pages, so padding
    in keys costs nothing) every short query is in one group: one attention call a layer, and on the CPU
    the whole stack of layers in one op (`decoder/fused_layer.py`)."""
    short = sorted(
        (s for s in seqs if s.query_len <= MAX_SHORT_QUERY_LEN), key=lambda s: (s.kv_len, s.query_len)
    )
    if one_short_group and short:
        long = [[s] for s in seqs if s.query_len > MAX_SHORT_QUERY_LEN]
        return [sorted(short, key=lambda s: s.query_start)] + long
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
    paths: AttentionPaths = field(default_factory=AttentionPaths)  #: measured kernel choice per query shape
    #: where page gathers go (a captured forward's own buffer); None: the KV cache's scratch buffer
    gather_buffer: torch.Tensor | None = None
    #: [num_tokens] each new token's slot as a tensor, whatever ``slot_mapping`` is (the fused rotary and
    #: cache write takes it); None: ``slot_mapping`` is that tensor
    slot_tensor: torch.Tensor | None = None

    @property
    def slots(self) -> torch.Tensor:  # [num_tokens]
        return self.slot_mapping if self.slot_tensor is None else self.slot_tensor

    @classmethod
    def build(
        cls,
        kv_cache,
        slot_mapping: torch.Tensor,
        seqs: list[SequenceSlice],
        block_size: int,
        paths: AttentionPaths | None = None,
    ):
        device = slot_mapping.device
        num_tokens = int(slot_mapping.shape[0])
        paths = paths or AttentionPaths()
        one_short_group = paths.batches_read_pages_in_place()
        groups = [
            build_group(g, block_size, device, kv_cache.padding_block)
            for g in group_sequences(seqs, one_short_group)
        ]
        lone = groups[0] if len(groups) == 1 else None
        writes: torch.Tensor | slice = slot_mapping
        if lone is not None and lone.kv_slice is not None:
            writes = slice(lone.kv_slice.stop - num_tokens, lone.kv_slice.stop)
        single = lone is not None and lone.query_slice == slice(0, num_tokens)
        slot_tensor = slot_mapping if isinstance(writes, slice) else None
        return cls(kv_cache, writes, groups, num_tokens, single, paths, None, slot_tensor)
