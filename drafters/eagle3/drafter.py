"""EAGLE-3 drafting: a one-layer head fed by the target's hidden states, with its own paged KV cache.

Per request the head's cache holds *real* entries: position t computed from the target's features
``h_t`` and the token ``x_{t+1}``, for every verified position. Each step:

1. catch-up: the positions verified since the last step (the whole prompt the first time) go through
   the head with the target features captured in the verifying forward; the last one's output is the
   first draft (this one forward is both the cache update and the first drafting step);
2. drafts 2..k: the head is fed its own pre-norm output and the previous draft, one position further;
3. next step the draft entries are rewound away and overwritten by the catch-up.

A head with a ``sliding_window`` attends only its last ``sliding_window`` positions, so a catch-up starts
no earlier than that many positions before its end: the earlier slots are held but never computed
(a long prompt costs the head only its last window). This is exact because the head has one layer: the
keys and values at a position depend on that position's own inputs only, and the one output a
catch-up keeps (its last) attends none of the skipped slots.

Drafts come from the reduced draft vocabulary and are mapped to target ids by ``d2t``; a guided
request's grammar mask reaches the draft logits through the same ``d2t`` map.
"""

from __future__ import annotations

import itertools
import time

import torch

from ...executor.engine.block_manager import BlockManager
from ...executor.engine.scratch_forward import SCRATCH_REQUEST_ID
from ...executor.engine.speculation.confidence_stop import ChainOdds
from ...executor.engine.speculation.tree_config import TreeShape
from ...executor.model.forward_io import SequenceInput
from ...executor.model.graph_shapes import GraphShapes
from ...executor.model.kv_cache import KVCache, KVCacheSpec, num_blocks_for_budget
from ...executor.model.model_runner import PagedInputs
from ...sampling import sample_from_probs
from ..base import Drafter, DraftProposal, draft_distribution
from ..draft_masks import DraftMasks
from ..ngram import NGramDrafter
from . import tree_growth
from .head import Eagle3Head, default_aux_layers
from .head_cache import HeadCache, PagedHeadAttention
from .options import TREE_GROWTHS
from .text_odds import TextOdds
from .tree_siblings import TreeSiblings


class Eagle3Drafter(Drafter):
    owns_kv_cache = True
    runs_on_loop_thread = True  #: built in: bounded work, no thread hop (see Drafter)
    accepts_grammar_masks = True  #: each drafting step of a guided request is masked (through d2t)
    reports_confidence = True  #: draft_len_policy "confidence" ends each chain by the head's confidence
    #: ``draft_tree: true``: the chain with the head's runners-up beside each of its nodes (`tree_siblings.py`)
    default_tree = TreeShape(max_nodes=6, branching=2)  # measured: bench/reports/2026-11-29-token-trees

    def __init__(
        self,
        head: Eagle3Head,
        max_draft_len: int,
        target_vocab_size: int,
        num_target_layers: int,
        *,
        sample_drafts: bool = False,
        kv_cache_memory_gb: float = 0.25,
        block_size: int = 16,
        max_num_tokens: int = 2048,
        prompt_lookup: bool = False,
        head_quantization=None,
        tree_growth: str = "dynamic",
    ) -> None:
        """``head_quantization``: how the head's weights were made to run (a
        `head_quantization.HeadQuantization`, for reports; None: the head as given); ``tree_growth``: how
        ``draft_tree`` grows (`options.TREE_GROWTHS`)."""
        super().__init__(max_draft_len)
        if tree_growth not in TREE_GROWTHS:
            raise ValueError(f"tree_growth must be one of {', '.join(TREE_GROWTHS)}, got {tree_growth!r}")
        cfg = head.config
        if cfg.vocab_size != target_vocab_size:
            raise ValueError(
                f"EAGLE-3 head vocabulary ({cfg.vocab_size}) differs from the target's ({target_vocab_size})"
            )
        layers = cfg.aux_layer_ids or default_aux_layers(num_target_layers)
        if len(layers) != 3 or not all(0 <= i <= num_target_layers for i in layers):
            raise ValueError(
                f"EAGLE-3 head reads target layers {list(layers)}: need three hidden_states indices "
                f"in 0..{num_target_layers}"
            )
        self.head = head
        self.hidden_state_layers = tuple(layers)
        self.vocab_size = target_vocab_size
        self.returns_draft_probs = sample_drafts
        self.is_deterministic = not sample_drafts
        dtype, device = head.dtype, head.norm.weight.device
        spec = KVCacheSpec(1, cfg.num_key_value_heads, cfg.head_dim, dtype)
        num_blocks = num_blocks_for_budget(spec, block_size, int(kv_cache_memory_gb * 2**30))
        self.block_manager = BlockManager(num_blocks, block_size)
        self.cache = HeadCache(self.block_manager, max_draft_len, cfg.sliding_window)
        self.inputs = PagedInputs(KVCache(spec, num_blocks, block_size, device), max_num_tokens)
        self._masks = DraftMasks(target_vocab_size, device)
        #: each request's own text, looked up for its current suffix (see `_pick_rows`)
        self.lookup = NGramDrafter(max_draft_len, is_public_pool=False) if prompt_lookup else None
        self.lookup_min_match = 2
        self.lookup_below_confidence = 0.5
        self.num_drafts_from_text = 0  #: drafts the text gave where the head was unsure (prompt lookup)
        #: how often each request's text drafts are accepted: their confidence under "confidence"
        self.text_odds = TextOdds()
        self.head_quantization = head_quantization
        self.tree_growth = tree_growth

    def capture_cuda_graphs(self, backend, max_batch_size: int, max_model_len: int) -> list:
        """The head's graphs: a catch-up of 1 + accepted positions (query lengths 1 and 1 + k) and each
        drafting step of one position, with the hidden states as a per-token input."""
        bs, inputs = self.block_manager.block_size, self.inputs
        # (the last k positions of a context at max_model_len need one page more: those steps run eagerly)
        pages = min(-(-max_model_len // bs), self.block_manager.num_blocks)
        shapes = GraphShapes.for_model(
            max_batch_size, (1, 1 + self.max_draft_len), pages, bs, inputs.max_num_tokens
        )
        hidden = (self.head.config.hidden_size, self.head.dtype)
        return [
            inputs.capture_forward(shapes, backend, "EAGLE-3 head", self._static_forward, {"hidden": hidden})
        ]

    def torch_modules(self) -> list[torch.nn.Module]:
        return [self.head]

    def warm_up(self) -> None:
        """The head over 1 + k scratch positions (a catch-up after a verify step), zeros for features."""
        num_tokens, bm = 1 + self.max_draft_len, self.block_manager
        bm.allocate(SCRATCH_REQUEST_ID, num_tokens)
        try:
            hidden = self.head.norm.weight.new_zeros(num_tokens, self.head.config.hidden_size)
            self._forward(
                [SequenceInput([0] * num_tokens, 0, bm.block_tables[SCRATCH_REQUEST_ID], 1)], hidden
            )
        finally:
            bm.free(SCRATCH_REQUEST_ID)

    def _static_forward(self, views, meta, token_inputs):
        """What a graph captures: the head over the shape's flat batch, outputs and logits at every row."""
        out = self.head.step(
            views.input_ids, token_inputs["hidden"], views.positions, self._attention(meta)
        )  # [B * Q, hidden]
        return {"out": out, "logits": self.head.logits(out)}, {}

    # ---- drafting -------------------------------------------------------------------------------
    def prepare_draft_tokens(self, scheduled_requests: list, resources) -> dict[str, DraftProposal]:
        free_blocks = self.block_manager.num_free_blocks
        ready, tree_slots, texts = [], {}, {}
        for s in scheduled_requests:
            if self._take_features(s.request):
                depth = s.max_draft_depth or s.num_draft_slots
                texts[s.request.request_id] = text = self._text_continuation(s.request)
                grows_tree = tree_growth.grows_tree(self, s, text)
                needed = self.cache.blocks_needed(
                    s.request, tree_growth.feed_slots(self, depth) if grows_tree else None
                )
                if needed <= free_blocks:  # else the head's pool is full: no drafts for it this step
                    free_blocks -= needed
                    ready.append((s.request, depth))
                    if grows_tree:
                        tree_slots[s.request.request_id] = s.num_draft_slots
        if not ready:
            return {}
        hidden, logits, root_inputs = self._catch_up([r for r, _ in ready])
        if not tree_slots:
            return self._draft_chains(scheduled_requests, ready, hidden, logits, texts)
        trees = [i for i, (r, _) in enumerate(ready) if r.request_id in tree_slots]
        chains = [i for i, (r, _) in enumerate(ready) if r.request_id not in tree_slots]
        proposals = tree_growth.grow_trees(
            self, [ready[i] for i in trees], tree_slots, root_inputs, hidden[trees], logits[trees]
        )
        if chains:
            chain_ready = [ready[i] for i in chains]
            proposals.update(
                self._draft_chains(scheduled_requests, chain_ready, hidden[chains], logits[chains], texts)
            )
        return proposals

    def _draft_chains(self, scheduled_requests, ready, hidden, logits, texts) -> dict[str, DraftProposal]:
        """Chains (with ``tree_growth: siblings``, the head's runners-up beside them) for ``ready``: (request,
        depth) pairs, the head's catch-up output [R, hidden] and logits [R, draft_vocab] at their roots,
        ``texts`` each request's own text continuation (prompt lookup)."""
        drafts: dict[str, list[int]] = {r.request_id: [] for r, _ in ready}
        probs: dict[str, list[torch.Tensor]] = {r.request_id: [] for r, _ in ready}
        grammars = {r.request_id: g.fork_for_drafting() for r, _ in ready if (g := self.grammar_of(r))}
        stop = self.confidence_stop
        chains = {r.request_id: ChainOdds() for r, _ in ready}
        text_drafts: dict[str, list[bool]] = {r.request_id: [] for r, _ in ready}  # per draft kept
        # with draft_tree: the head's runners-up at each depth, as leaves beside the chain's node
        siblings = TreeSiblings(self.draft_tree, scheduled_requests) if self.draft_tree is not None else None
        active = list(ready)
        step_started = None
        while True:
            still = []
            matchers = [grammars.get(r.request_id) for r, _ in active]
            from_text = [_at(texts[r.request_id], len(drafts[r.request_id])) for r, _ in active]
            picks = self._pick_rows(logits, [r for r, _ in active], matchers, from_text)
            if siblings is not None:
                siblings.add_level(logits, [r for r, _ in active], [p[0] for p in picks], matchers, self.head)
            if stop is not None and step_started is not None:  # (picking reads the step's results back)
                stop.time_draft_step(time.perf_counter() - step_started)
            for j, ((r, n), (token, q, confidence, is_text)) in enumerate(zip(active, picks)):
                if token is None:
                    continue
                if token != from_text[j]:  # the chain left the request's text: the head drafts on
                    texts[r.request_id] = ()
                if stop is not None:
                    chain = chains[r.request_id]
                    odds = self.text_odds.estimate(r.request_id) if is_text else confidence
                    if not stop.keeps(chain, odds, len(scheduled_requests)):
                        continue  # one more draft would not pay: this chain ends here
                    chain.keep(odds)
                drafts[r.request_id].append(token)
                text_drafts[r.request_id].append(is_text)
                if q is not None:
                    probs[r.request_id].append(q)
                if len(drafts[r.request_id]) < n:
                    still.append((j, r, n))
            if not still or not self.cache.reserve([r for _, r, _ in still]):
                break
            step_started = time.perf_counter()
            hidden, logits = self._draft_step(
                [r for _, r, _ in still],
                hidden[[j for j, _, _ in still]],
                [drafts[r.request_id][-1] for _, r, _ in still],
            )
            active = [(r, n) for _, r, n in still]
        for rid, chain_from_text in text_drafts.items():
            self.text_odds.record_chain(rid, chain_from_text)
        return {
            rid: siblings.proposal(rid, tokens)
            if siblings is not None and siblings.has_leaves(rid)
            else DraftProposal(tokens, torch.stack(probs[rid]) if probs[rid] else None)
            for rid, tokens in drafts.items()
        }

    def _text_continuation(self, request) -> tuple[int, ...]:
        """Prompt lookup: what followed the first earlier occurrence, in the request's own prompt and
        output, of the longest suffix (3 tokens at most) that occurred before, when that suffix has
        at least ``lookup_min_match`` tokens; else () (and always () with lookup off)."""
        if self.lookup is None:
            return ()
        key, continuation = self.lookup.lookup(request)
        return continuation if key >= self.lookup_min_match else ()

    def _take_features(self, request) -> bool:
        return self.cache.take_features(request)

    def _catch_up(self, requests) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Feed every request's pending positions (pairs h_t, x_{t+1}), in chunks that fit a forward;
        the pre-norm output [R, hidden] and draft logits [R, draft_vocab] at each one's last position,
        and per request the fused features fed there (a dynamic tree's root input)."""
        self.cache.rewind_to_real(requests)
        self.cache.skip_outside_window(requests)
        budget = self.inputs.max_num_tokens
        todo = list(requests)
        last: dict[str, torch.Tensor] = {}
        root_inputs: dict[str, torch.Tensor] = {}  # [hidden] each: the fused features fed last
        while todo:
            items, used = [], 0
            for r in todo:
                st = self.cache.states[r.request_id]
                take = min(st.pending_end - st.num_real, budget - used)
                if take > 0:
                    items.append((r, take))
                    used += take
            seqs, features = [], []
            for r, take in items:
                st = self.cache.states[r.request_id]
                self.cache.grow(r, take)
                first = st.num_real - st.pending_start
                features.append(st.pending[first : first + take])
                tokens = r.token_ids[st.num_real + 1 : st.num_real + 1 + take]  # x_{t+1} for each t
                seqs.append(
                    SequenceInput(tokens, st.num_real, self.block_manager.block_tables[r.request_id], 1)
                )
            fused = self.head.fuse(torch.cat(features))  # [sum(take), hidden]
            out, logits = self._forward(seqs, fused)
            ends = list(itertools.accumulate(take for _, take in items))
            for k, (r, take) in enumerate(items):
                st = self.cache.states[r.request_id]
                st.num_real += take
                if st.num_real == st.pending_end:
                    st.pending, st.pending_start = None, st.num_real
                    last[r.request_id] = (out[k], logits[k])
                    root_inputs[r.request_id] = fused[ends[k] - 1]
            todo = [r for r in todo if r.request_id not in last]
        hidden = torch.stack([last[r.request_id][0] for r in requests])  # [R, hidden]
        logits = torch.stack([last[r.request_id][1] for r in requests])  # [R, draft_vocab]
        return hidden, logits, root_inputs

    def _draft_step(self, requests, hidden, tokens) -> tuple[torch.Tensor, torch.Tensor]:
        """One position further for each request: its own previous output and its last draft token."""
        seqs = []
        for r in requests:
            rid = r.request_id
            pos = self.block_manager.num_slots[rid] - 1
            seqs.append(SequenceInput([tokens[len(seqs)]], pos, self.block_manager.block_tables[rid], 1))
        return self._forward(seqs, hidden)

    @torch.inference_mode()
    def _forward(self, seqs: list[SequenceInput], hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over a flattened batch (replayed from a graph when one holds it): its pre-norm output
        [R, hidden] and draft logits [R, draft_vocab] at each sequence's last token."""
        if self.inputs.graphs is not None and all(seq.tree_parents is None for seq in seqs):
            replayed = self.inputs.graphs.run(seqs, {"hidden": hidden})
            if replayed is not None:
                _, per_row, _ = replayed
                return per_row["out"], per_row["logits"]
        batch = self.inputs.prepare(seqs)
        out = self.head.step(batch.input_ids, hidden, batch.positions, self._attention(batch.metadata))
        out = out[batch.logit_indices]
        return out, self.head.logits(out)

    def _attention(self, metadata) -> PagedHeadAttention:
        return PagedHeadAttention(metadata, self.head.config.sliding_window)

    # ---- picking a token ------------------------------------------------------------------------
    def _pick_rows(
        self, logits: torch.Tensor, requests: list, matchers: list, from_text: list | None = None
    ) -> list[tuple[int | None, torch.Tensor | None, float, bool]]:
        """Each request's next draft as a target id from its row of ``logits`` [R, draft_vocab] (greedy,
        or sampled with q over the target vocabulary), and the head's confidence: the largest
        probability of the row's (masked) distribution, read before a sampled token is drawn. None when
        its grammar is done or leaves no draft-vocabulary token (its row holds no finite logit). The
        greedy ids, the rows' finiteness and the confidences come back in one read.

        ``from_text`` holds, per row, the token the request's own text continues with (prompt lookup;
        None: no such token). Where the head's confidence is below ``lookup_below_confidence`` and the
        grammar allows it, that token is the draft instead, with a one-hot q when the request samples:
        the choice depends on the context only, so q is the distribution the draft came from. The last
        field says whether the draft is the text's."""
        from_text = from_text or [None] * len(requests)
        logits = logits.float()
        done = [m is not None and m.is_terminated() for m in matchers]
        matchers = [None if is_done else m for m, is_done in zip(matchers, done)]
        self._masks.apply(logits, matchers, d2t=self.head.d2t)
        targets = self.head.to_target_ids(logits.argmax(dim=-1))  # [R]
        finite = torch.isfinite(logits.amax(dim=-1))  # [R]: some token is allowed
        needs_confidence = self.confidence_stop is not None or any(t is not None for t in from_text)
        if needs_confidence:  # [R] (NaN where nothing is allowed)
            confidence = torch.softmax(logits, dim=-1).amax(dim=-1)
        else:  # no rule reads it: no softmax on the drafting path
            confidence = torch.zeros_like(finite, dtype=torch.float64)
        answers = torch.stack([targets.double(), finite.double(), confidence.double()], dim=1).tolist()
        picks: list[tuple[int | None, torch.Tensor | None, float, bool]] = []
        for i, (request, matcher) in enumerate(zip(requests, matchers)):
            token, q, sure = int(answers[i][0]), None, answers[i][2]
            if done[i] or not answers[i][1]:
                picks.append((None, None, 0.0, False))
                continue
            params = request.sampling_params
            sampled = self.returns_draft_probs and not params.is_greedy
            if sampled:
                q_draft = draft_distribution(logits[i], params)  # [draft_vocab]
                sure = float(q_draft.max()) if needs_confidence else sure
            text = from_text[i]
            unsure = text is not None and sure < self.lookup_below_confidence
            if unsure and (matcher is None or matcher.accept_token(text)):
                self.num_drafts_from_text += 1
                picks.append((text, self._one_hot(text, logits.device) if sampled else None, sure, True))
                continue
            if sampled:
                dev = logits.device
                draft_id = sample_from_probs(q_draft, request.generator)
                q = torch.zeros(self.vocab_size, dtype=q_draft.dtype, device=dev)
                q[self.head.to_target_ids(torch.arange(len(q_draft), device=dev))] = q_draft
                token = draft_id + int(self.head.d2t[draft_id])
            if matcher is not None and not matcher.accept_token(token):
                picks.append((None, None, 0.0, False))
                continue
            picks.append((token, q, sure, False))
        return picks

    def _one_hot(self, token: int, device) -> torch.Tensor:
        q = torch.zeros(self.vocab_size, dtype=torch.float32, device=device)
        q[token] = 1.0
        return q  # [vocab]

    def on_verified(self, request, num_accepted: int) -> None:
        self.text_odds.observe(request.request_id, num_accepted)

    def release(self, request) -> None:
        if self.lookup is not None:
            self.lookup.release(request)
        self.text_odds.forget(request.request_id)
        self.cache.release(request.request_id)


def _at(continuation: tuple[int, ...], i: int) -> int | None:
    return continuation[i] if i < len(continuation) else None
