"""Where each short run of tokens occurred, and what most often came next: the lookup behind suffix
decoding and REST.

A `SuffixIndex` holds token sequences (a request's prompt and output, earlier requests' outputs, or a
datastore's documents) and maps each *key* (a run of 1, 2, 4 or 8 tokens) to the places it ended.
`speculate` answers the question a suffix tree answers (SuffixDecoding, arXiv 2411.04975; arctic-inference
builds the tree) without building one:

1. **Match.** The context's last 8 tokens are looked up, then its last 4, 2, 1, until a key has an
   occurrence with a token after it. Each such occurrence is compared backwards with the context, up to
   ``max_depth`` tokens; the longest agreeing suffix is the *match*, and the occurrences that agree that
   far are the node a suffix tree would reach.
2. **Expand.** From those occurrences, the token that most often follows is drafted, with probability
   count / occurrences (a tie: the oldest occurrence's, as NGram's ``is_use_oldest`` default; on BFCL it
   was the better rule, elsewhere level); the occurrences that continue that way go on to the next token.
   The chain stops when the product of the probabilities falls below ``min_token_prob``, when no
   occurrence goes on, or at ``max_spec_factor * match + max_spec_offset`` tokens: a long match earns a
   long draft, a one-token match a short one.
3. **Score.** The sum of the chain's probabilities: the number of drafts expected to be accepted, which
   chooses between two indexes' answers (a request's own text and the shared store).

Each token adds one place per key length: about 2 us and 310 bytes a token in all
(`bench/reports/2026-11-29-suffix-decoding/index_cost.txt`).
Removing a sequence leaves its entries behind until they are half the index, then the index is rebuilt
from the live sequences, so removal costs O(1) amortized. A lookup reads at most ``max_occurrences`` of
a key's most recent places, so a key seen a million times costs what one seen a hundred times does.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

#: key lengths indexed: the longest first in a lookup
KEY_LENGTHS = (8, 4, 2, 1)
_SHIFT = 32  #: packed place: sequence id << 32 | end (the position after the key's last token)
_POS_MASK = (1 << _SHIFT) - 1
_BYTES = 8  #: a place in a key's bytearray: native int64, as array("q") reads it
_ORDER = sys.byteorder


@dataclass(slots=True)
class Speculation:
    """One index's answer: the drafted chain, each draft's cumulative probability, their sum."""

    token_ids: list[int]
    probs: list[float]  #: probs[i]: estimated chance that drafts 0..i are all accepted
    match_len: int  #: context tokens matched (0: nothing matched)

    @property
    def score(self) -> float:
        """The number of drafts expected to be accepted."""
        return sum(self.probs)


NO_SPECULATION = Speculation([], [], 0)


@dataclass(slots=True, frozen=True)
class SpeculationLimits:
    """How far `SuffixIndex.speculate` goes (SuffixDecoding's knobs, vLLM's names without the prefix)."""

    max_depth: int = 24  #: longest context suffix compared with an occurrence
    #: drafts per matched token, and drafts added to that (may be negative). vLLM's defaults are 1 and 0;
    #: 2 and 1 drafted more of what was accepted on all five bench sets, and ran faster on BFCL
    #: (`bench/reports/2026-11-29-suffix-decoding/`)
    max_spec_factor: float = 2.0
    max_spec_offset: float = 1.0
    min_token_prob: float = 0.1  #: stop once the chain's estimated acceptance falls below this
    max_occurrences: int = 64  #: a key's most recent places read per lookup

    def draft_budget(self, match_len: int, num_slots: int) -> int:
        return max(0, min(num_slots, int(self.max_spec_factor * match_len + self.max_spec_offset)))


DEFAULT_LIMITS = SpeculationLimits()


class SuffixIndex:
    """Token sequences and, per key of `KEY_LENGTHS` tokens, where it ended (oldest first)."""

    __slots__ = ("sequences", "indexed", "entries", "num_entries", "num_dead", "_next_id")

    def __init__(self) -> None:
        self.sequences: dict[int, Sequence[int]] = {}  #: live sequence id -> its tokens
        self.indexed: dict[int, int] = {}  #: live sequence id -> how many of its tokens are indexed
        #: key -> one packed place, or a bytearray of them (int64 each), oldest first. Not a list or an
        #: array: 8 bytes a place instead of 40, and nothing the garbage collector walks (with lists or
        #: arrays, each full collection over a million-token index took 0.4 s)
        self.entries: dict[tuple[int, ...], int | bytearray] = {}
        self.num_entries = 0  #: places stored (dead ones included)
        self.num_dead = 0  #: places of removed sequences not yet dropped
        self._next_id = 0

    def __len__(self) -> int:
        return len(self.sequences)

    # ---- building ---------------------------------------------------------------------------------
    def add(self, tokens: Sequence[int]) -> int:
        """Index a new sequence; returns its id. ``tokens`` is kept by reference: a list that grows
        (a request's tokens) is indexed further by `extend`."""
        seq_id = self._next_id
        self._next_id += 1
        self.sequences[seq_id] = tokens
        self._index(seq_id, tokens, 0)
        return seq_id

    def extend(self, seq_id: int) -> None:
        """Index the tokens appended to sequence ``seq_id`` since it was last indexed."""
        self._index(seq_id, self.sequences[seq_id], self.indexed[seq_id])

    def _index(self, seq_id: int, tokens: Sequence[int], start: int) -> None:
        """Add the places ending after ``tokens[start - 1]``: per key length, the keys come from ``zip``
        over shifted slices, built in C."""
        num_tokens = len(tokens)
        self.indexed[seq_id] = num_tokens
        entries = self.entries
        get = entries.get
        base = seq_id << _SHIFT
        for n in KEY_LENGTHS:
            first_end = max(start + 1, n)  # the first place: a key tokens[first_end - n : first_end]
            if first_end > num_tokens:
                continue
            window = tokens[first_end - n : num_tokens]
            keys = zip(*(window[i : len(window) - n + 1 + i] for i in range(n)))
            for key, place in zip(keys, range(base + first_end, base + num_tokens + 1)):
                found = get(key)
                if found is None:
                    entries[key] = place
                elif found.__class__ is int:
                    entries[key] = bytearray(found.to_bytes(_BYTES, _ORDER) + place.to_bytes(_BYTES, _ORDER))
                else:
                    found += place.to_bytes(_BYTES, _ORDER)
            self.num_entries += num_tokens - first_end + 1

    def remove(self, seq_id: int) -> None:
        """Forget a sequence (its places are dropped lazily)."""
        if self.sequences.pop(seq_id, None) is None:
            return
        indexed = self.indexed.pop(seq_id)
        self.num_dead += sum(indexed - n + 1 for n in KEY_LENGTHS if indexed >= n)
        if self.num_dead * 2 > self.num_entries:
            self._rebuild()

    def _rebuild(self) -> None:
        self.entries = {}
        self.num_entries = self.num_dead = 0
        for seq_id, tokens in sorted(self.sequences.items()):
            self._index(seq_id, tokens[: self.indexed[seq_id]], 0)

    # ---- lookup -----------------------------------------------------------------------------------
    def _match(self, context: Sequence[int], limits: SpeculationLimits) -> tuple[int, list]:
        """(match length, [(tokens, next position)] of the occurrences matching that far)."""
        num_context = len(context)
        sequences = self.sequences
        for n in KEY_LENGTHS:
            if n > num_context or n > limits.max_depth:
                continue
            found = self.entries.get(tuple(context[num_context - n :]))
            if found is None:
                continue
            places = [found] if type(found) is int else array("q", found[-_BYTES * limits.max_occurrences :])
            best, node = 0, []
            for place in places:
                tokens = sequences.get(place >> _SHIFT)
                end = place & _POS_MASK
                if tokens is None or end >= len(tokens):  # removed, or nothing after it yet
                    continue
                m = n
                while m < limits.max_depth and m < end and m < num_context:
                    if tokens[end - m - 1] != context[num_context - m - 1]:
                        break
                    m += 1
                if m > best:
                    best, node = m, [(tokens, end)]
                elif m == best:
                    node.append((tokens, end))
            if node:
                return best, node
        return 0, []

    def speculate(self, context: Sequence[int], num_slots: int, limits: SpeculationLimits) -> Speculation:
        """The chain of at most ``num_slots`` drafts after ``context`` (see the module docstring)."""
        match_len, node = self._match(context, limits)
        budget = limits.draft_budget(match_len, num_slots)
        token_ids: list[int] = []
        probs: list[float] = []
        chance = 1.0
        while node and len(token_ids) < budget:
            counts: dict[int, int] = {}  #: next token -> occurrences, in order of first occurrence
            for tokens, pos in node:  # oldest first
                if pos < len(tokens):
                    counts[tokens[pos]] = counts.get(tokens[pos], 0) + 1
            if not counts:
                break
            best = max(counts.values())
            token = next(t for t, c in counts.items() if c == best)  # a tie: the oldest occurrence's
            chance *= best / len(node)
            if chance < limits.min_token_prob:
                break
            token_ids.append(token)
            probs.append(chance)
            node = [(tokens, pos + 1) for tokens, pos in node if pos < len(tokens) and tokens[pos] == token]
        return Speculation(token_ids, probs, match_len)
