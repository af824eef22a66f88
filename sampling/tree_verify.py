"""Verification of a token tree of drafts (`tree_shape.py`): the walk down the branch the target takes.

From the root's row, the target's token is drawn (greedy: its argmax; sampling: one draw from its
distribution p after temperature, top-k, top-p and min-p); if a child of the current node carries that
token, the walk moves to the child and draws again from its row, else the drawn token is emitted and
the walk ends. The nodes walked are accepted, the last draw is the recovered or bonus token.

Why it is lossless: every emitted token is a draw from the target's distribution at its position given
the tokens before it, exactly as plain decoding draws it (and with the very same draws from the
request's generator, one per emitted token). The drafts only decide which rows were computed ahead; a
draw that no child carries ends the step. This needs the tree to be a function of the context alone
(no draw from the request's generator while drafting), which holds for every tree-drafting drafter
here; a drafter's own distribution q is not used. Greedy is the special case of argmax draws.

Rows that cannot be read (NaN, +inf, or all -inf) are never entered: a child whose row is bad is not
followed, and a request whose root row is bad gets no tokens and says why (as `rejection.py` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .host_values import device_tensor
from .logits import compute_probs
from .params import SamplingParams, filter_flags
from .rejection import ROW_STATUS, RowSummary, row_summary
from .sampler import draw_token


@dataclass(slots=True)
class TreeVerification:
    """What one request gets out of verifying its tree."""

    path: list[int]  #: the accepted nodes, root's child first
    token_ids: list[int]  #: their tokens, then the recovered or bonus token
    unusable: str | None = None  #: why the root's row could not be read; no tokens then

    @property
    def num_accepted(self) -> int:
        return len(self.path)


def verify_tree(
    logits: Tensor,  # [1 + nodes, vocab]: the root's row, then each node's
    tokens: Sequence[int],  # [nodes] the drafts
    parents: Sequence[int],  # [nodes] each node's parent (-1: the root)
    params: SamplingParams,
    generator: torch.Generator | None,
    summarize_rows: RowSummary = row_summary,
) -> TreeVerification:
    num_nodes = len(tokens)
    if logits.shape[0] != num_nodes + 1 or len(parents) != num_nodes:
        raise ValueError(
            f"a tree of {num_nodes} nodes ({len(parents)} parents) needs {num_nodes + 1} rows, "
            f"got {logits.shape[0]}"
        )
    summary = summarize_rows(logits).tolist()  # [rows, 2]: status, argmax
    if summary[0][0] != 0:
        return TreeVerification([], [], ROW_STATUS[summary[0][0]])
    child_of: dict[tuple[int, int], int] = {}
    for node, (token, parent) in enumerate(zip(tokens, parents)):
        if summary[node + 1][0] == 0:  # a bad row is never entered
            child_of.setdefault((parent, token), node)
    probs = None if params.is_greedy else _target_probs(logits, params)  # [rows, vocab]
    path: list[int] = []
    at = -1
    while True:
        row = at + 1
        drawn = summary[row][1] if probs is None else int(draw_token(probs[row], generator).item())
        child = child_of.get((at, drawn))
        if child is None:
            return TreeVerification(path, [tokens[n] for n in path] + [drawn])
        path.append(child)
        at = child


def _target_probs(logits: Tensor, params: SamplingParams) -> Tensor:  # [rows, vocab]
    rows, dev = logits.shape[0], logits.device
    return compute_probs(
        logits,
        device_tensor([params.temperature] * rows, torch.float32, dev),
        device_tensor([params.top_k] * rows, torch.long, dev),
        device_tensor([params.top_p] * rows, torch.float32, dev),
        device_tensor([params.min_p] * rows, torch.float32, dev),
        **filter_flags([params] * rows, logits.shape[-1]),
    )
