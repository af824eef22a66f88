"""What a forward takes and gives: one request's share of a flat batch (`SequenceInput`) and the
forward's logits and captured hidden states (`ForwardOutput`), and the one failure a runner reports
beyond an exception of the forward itself (`KVCacheLost`). Its own module because the runner, its
static buffers and its CUDA graphs all use these types."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class SequenceInput:
    """One request's share of a forward."""

    token_ids: list[int]  #: new tokens (uncomputed tokens, then draft tokens)
    start_pos: int  #: position of token_ids[0]
    block_table: list[int]  #: the request's pages (already sized for start_pos + len(token_ids))
    num_logit_rows: int  #: logits wanted for the last this-many tokens (0 for a mid-prompt chunk)
    #: the draft tokens (all but token_ids[0]) as a token tree: each one's parent (-1: token_ids[0]),
    #: `sampling/tree_shape.py`; None: a chain (each attends every token before it)
    tree_parents: list[int] | None = None


@dataclass(slots=True)
class ForwardOutput:
    logits: torch.Tensor  # [num_logit_rows, vocab] rows of all sequences, in order
    cu_logit_rows: list[int]  # [batch + 1] offsets of each sequence's rows in `logits`
    hidden_states: dict[int, torch.Tensor]  # layer index -> [num_tokens, hidden] (captured layers only)
    cu_tokens: list[int]  # [batch + 1] offsets of each sequence's tokens in the flat batch


def merge_outputs(outputs: list[ForwardOutput | None], seqs: list[SequenceInput]) -> ForwardOutput | None:
    """One ForwardOutput from one forward per sequence, in order. A sequence whose forward failed (None)
    keeps its place with NaN logit rows and zero hidden states, so every offset is the batch's own;
    None when every forward failed."""
    done = [out for out in outputs if out is not None]
    if not done:
        return None
    ref = done[0]
    logits: list[torch.Tensor] = []
    hidden: dict[int, list[torch.Tensor]] = {layer: [] for layer in ref.hidden_states}
    cu_rows, cu_tokens = [0], [0]
    for out, seq in zip(outputs, seqs):
        num_tokens, num_rows = len(seq.token_ids), seq.num_logit_rows
        if out is None:
            logits.append(ref.logits.new_full((num_rows, ref.logits.shape[1]), float("nan")))
            for layer, h in ref.hidden_states.items():
                hidden[layer].append(h.new_zeros(num_tokens, h.shape[-1]))
        else:
            logits.append(out.logits)
            for layer in hidden:
                hidden[layer].append(out.hidden_states[layer])
        cu_rows.append(cu_rows[-1] + num_rows)
        cu_tokens.append(cu_tokens[-1] + num_tokens)
    merged_hidden = {layer: torch.cat(parts) for layer, parts in hidden.items()}
    return ForwardOutput(torch.cat(logits), cu_rows, merged_hidden, cu_tokens)


class KVCacheLost(RuntimeError):
    """A runner's forward failed and the K/V its earlier forwards wrote is gone (tensor-parallel ranks
    started again): every request holding pages must stop, and no cached page may be reused."""
