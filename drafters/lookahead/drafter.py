"""Lookahead decoding as a drafter (arXiv 2402.02057; llama.cpp's `lookahead` example, TensorRT-LLM's
lookahead): no training, no second model. Each step drafts, for every request, its Jacobi window (the
guesses for the next positions, `jacobi.py`) and the pool's n-grams that start after its last token;
with ``draft_tree`` they are one token tree verified in the one forward, else the step drafts the pool's
newest n-gram, or the window where the pool has none. The target's greedy token at each row of the
window's branch comes back after the forward (``wants_target_tokens``): the next Jacobi iterate, from
which the pool learns.

Options (TensorRT-LLM's lookahead names them ``max_window_size``, ``max_ngram_size``,
``max_verification_set_size``): ``window_size``, ``ngram_size``, ``pool_size`` (n-grams kept per first
token) and ``verification_set_size`` (the pool's n-grams drafted per step).
"""

from __future__ import annotations

from ...executor.engine.speculation.tree_config import TreeShape
from ...sampling.tree_shape import trie_of_chains
from ..base import Drafter, DraftProposal, options_from
from .jacobi import JacobiState
from .options import LookaheadOptions


class LookaheadDrafter(Drafter):
    runs_on_loop_thread = True  #: built in: bounded work, no thread hop (see Drafter)
    wants_target_tokens = True  #: the target's greedy token at each draft row (the Jacobi iterate)
    #: ``draft_tree: true``: the window and the pool's n-grams as one tree
    default_tree = TreeShape(max_nodes=8, branching=3)

    def __init__(self, max_draft_len: int = 3, options: LookaheadOptions | None = None, **fields) -> None:
        """``options`` (a `LookaheadOptions`) or its fields as keyword arguments."""
        super().__init__(max_draft_len)
        self.options = options_from(LookaheadOptions, options, fields)
        self._states: dict[str, JacobiState] = {}
        #: request id -> (root position, drafts, the guess branch's nodes) of its last proposal
        self._proposed: dict[str, tuple[int, list[int], list[int]]] = {}

    def _state(self, request) -> JacobiState:
        state = self._states.get(request.request_id)
        if state is None:
            c = self.options
            state = self._states[request.request_id] = JacobiState(c.window_size, c.ngram_size, c.pool_size)
        self._learn(request, state)
        state.index_text(request.token_ids)
        return state

    def _learn(self, request, state: JacobiState) -> None:
        """Take the last step's iterate: the target's tokens at the root's row and the guess branch's."""
        proposed = self._proposed.pop(request.request_id, None)
        seen = getattr(request, "target_tokens", None)
        if proposed is None or seen is None:
            return
        root_pos, drafts, branch = proposed
        tokens, argmax = list(seen[0]), seen[1]
        if len(argmax) != len(tokens) + 1:
            return
        if tokens == drafts:  # verified as proposed
            rows = [1 + node for node in branch]
        elif tokens == [drafts[n] for n in branch][: len(tokens)]:  # its guess branch alone, as a chain
            rows = list(range(1, len(tokens) + 1))
        else:
            return  # not this proposal's rows
        state.window = state.window[: len(rows)]
        state.take_iterate(root_pos, [argmax[0]] + [argmax[r] for r in rows])

    def num_draft_slots(self, request) -> int:
        """Always a window to verify: the full depth."""
        return self.max_draft_len

    def prepare_draft_tokens(self, scheduled_requests: list, resources) -> dict[str, DraftProposal]:
        return {s.request.request_id: self._propose(s) for s in scheduled_requests}

    def _propose(self, s) -> DraftProposal:
        request, c = s.request, self.options
        state = self._state(request)
        tokens = request.token_ids
        root_pos = len(tokens) - 1
        depth = min(s.max_draft_depth or s.num_draft_slots, self.max_draft_len)
        window = state.window_for(root_pos, tokens, min(depth, c.window_size))
        grams = [g[:depth] for g in state.pool.continuations(tokens[-1], c.verification_set_size)]
        if self.draft_tree is not None:
            drafts, parents = trie_of_chains(
                [window, *grams], s.num_draft_slots, depth, self.draft_tree.branching
            )
            branch = _branch_nodes(drafts, parents, window)
        else:  # a chain: the pool's newest n-gram, else the window (both are guesses the iterate improves)
            chain = list(grams[0] if grams else window)[: s.num_draft_slots]
            state.window, state.window_start = chain, root_pos + 1
            drafts, parents, branch = chain, None, list(range(len(chain)))
        self._proposed[request.request_id] = (root_pos, list(drafts), branch)
        return DraftProposal(list(drafts), parents=parents)

    def release(self, request) -> None:
        self._states.pop(request.request_id, None)
        self._proposed.pop(request.request_id, None)


def _branch_nodes(drafts: list[int], parents: list[int], chain: list[int]) -> list[int]:
    """The nodes along ``chain`` from the root (as far as the tree holds it)."""
    nodes, at = [], -1
    for token in chain:
        child = next((i for i, (t, p) in enumerate(zip(drafts, parents)) if p == at and t == token), None)
        if child is None:
            break
        nodes.append(child)
        at = child
    return nodes
