"""One tensor-parallel step as one int64 tensor (no pickling per step), and back: what the front
broadcasts to the ranks, through shared memory (`step_channel.py`) or torch.distributed
(`torchrun_runner.py`).

Layout: ``[command, ...]``. A forward: ``[FORWARD, num_seqs, num_tokens, num_table_entries]``, then per
sequence ``[num_tokens, start_pos, num_logit_rows, table_len]``, then every sequence's tokens, then
every block table. A capture: ``[CAPTURE, n, layer_1 .. layer_n]``. A stop: ``[STOP]``.
"""

from __future__ import annotations

import torch

from ..model.forward_io import SequenceInput

FORWARD, STOP, CAPTURE = 1, 2, 3
HEADER = 4  #: ints before a forward's per-sequence records
PER_SEQUENCE = 4


def encode_forward(seqs: list[SequenceInput]) -> torch.Tensor:  # [size] int64
    records, tokens, tables = [], [], []
    for s in seqs:
        records += [len(s.token_ids), s.start_pos, s.num_logit_rows, len(s.block_table)]
        tokens += s.token_ids
        tables += s.block_table
    return torch.tensor([FORWARD, len(seqs), len(tokens), len(tables), *records, *tokens, *tables])


def encode_capture(layers: tuple[int, ...]) -> torch.Tensor:  # [2 + n] int64
    return torch.tensor([CAPTURE, len(layers), *layers])


def encode_stop() -> torch.Tensor:  # [1] int64
    return torch.tensor([STOP])


def decode(payload: torch.Tensor) -> list[SequenceInput] | tuple[int, ...] | None:
    """A forward's sequences, or the hidden-state layers to capture (a tuple), or None: stop.
    ``payload``: at least the encoded step (anything after it is ignored)."""
    command = int(payload[0])
    if command == STOP:
        return None
    if command == CAPTURE:
        return tuple(payload[2 : 2 + int(payload[1])].tolist())
    num_seqs, num_tokens, num_table = payload[1:HEADER].tolist()
    end = HEADER + PER_SEQUENCE * num_seqs
    records = payload[HEADER:end].view(num_seqs, PER_SEQUENCE).tolist()
    tokens = payload[end : end + num_tokens].tolist()
    tables = payload[end + num_tokens : end + num_tokens + num_table].tolist()
    seqs, t, b = [], 0, 0
    for n, start_pos, rows, table_len in records:
        seqs.append(SequenceInput(tokens[t : t + n], start_pos, tables[b : b + table_len], rows))
        t, b = t + n, b + table_len
    return seqs
