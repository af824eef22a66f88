"""Draft/target speculation: a second (smaller or quantized) model with the target's tokenizer drafts.

The draft model has its own paged KV cache. Each step it first catches up on the tokens the target
accepted since its last step (plus the bonus token), in the same forward that yields its first draft;
then it feeds each draft token to get the next. Its cache is kept in step by comparing the tokens it
has fed with the request's verified tokens and rewinding past the first difference, so rejections and
preemptions need no extra bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...executor.engine.block_manager import BlockManager
from ...executor.engine.scratch_forward import scratch_forward
from ...executor.model.decoder.convert import resolve_model_impl
from ...executor.model.forward_io import SequenceInput
from ...executor.model.graph_shapes import GraphShapes
from ...executor.model.kv_cache import KVCache, KVCacheSpec, num_blocks_for_budget
from ...executor.model.model_runner import ModelRunner
from ...sampling import sample_from_probs
from ..base import Drafter, DraftProposal, draft_distribution
from ..draft_masks import DraftMasks


def check_vocab_compatible(
    draft_model, target_vocab_size: int, draft_tokenizer=None, target_tokenizer=None
) -> None:
    draft_vocab = draft_model.config.get_text_config().vocab_size
    if draft_vocab != target_vocab_size:
        raise ValueError(
            f"draft model vocabulary ({draft_vocab} tokens) differs from the target's ({target_vocab_size}); "
            "a draft model must use the target's tokenizer"
        )
    both = draft_tokenizer is not None and target_tokenizer is not None
    if both and draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise ValueError(
            "draft and target tokenizers map tokens to different ids; use the target's tokenizer"
        )


@dataclass(slots=True)
class _DraftState:
    fed: list[int] = field(default_factory=list)  #: tokens whose K/V are in the draft cache, in order


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class DraftTargetDrafter(Drafter):
    owns_kv_cache = True
    runs_on_loop_thread = True  #: built in: bounded work, no thread hop (see Drafter)
    accepts_grammar_masks = True  #: each drafting step of a guided request is masked by its grammar

    def __init__(
        self,
        draft_model: torch.nn.Module,
        max_draft_len: int,
        target_vocab_size: int,
        *,
        sample_drafts: bool = False,
        kv_cache_memory_gb: float = 0.25,
        num_kv_blocks: int | None = None,
        block_size: int = 16,
        max_num_tokens: int = 512,
        model_impl: str = "auto",
    ) -> None:
        super().__init__(max_draft_len)
        check_vocab_compatible(draft_model, target_vocab_size)
        #: which forward runs the draft model (`model_impl`, as for the target; converts it in place)
        self.model_impl = resolve_model_impl(draft_model, model_impl)
        self.vocab_size = target_vocab_size
        #: sampled drafts carry q and are verified with min(1, p/q); greedy drafts are deterministic
        self.returns_draft_probs = sample_drafts
        self.is_deterministic = not sample_drafts
        param = next(draft_model.parameters())
        spec = KVCacheSpec.from_model_config(draft_model.config, _activation_dtype(draft_model))
        num_blocks = num_kv_blocks or num_blocks_for_budget(spec, block_size, int(kv_cache_memory_gb * 2**30))
        self.block_manager = BlockManager(num_blocks, block_size)
        self.runner = ModelRunner(
            draft_model, KVCache(spec, num_blocks, block_size, param.device), max_num_tokens
        )
        self._states: dict[str, _DraftState] = {}
        self._masks = DraftMasks(target_vocab_size, param.device)

    def capture_cuda_graphs(self, backend, max_batch_size: int, max_model_len: int) -> list:
        """The draft model's graphs: a catch-up of one or two tokens (the bonus token, or the last draft
        and the bonus token) and each drafting step of one token."""
        bs = self.block_manager.block_size
        # (the last k positions of a context at max_model_len need one page more: those steps run eagerly)
        pages = min(-(-max_model_len // bs), self.block_manager.num_blocks)
        shapes = GraphShapes.for_model(max_batch_size, (1, 2), pages, bs, self.runner.max_num_tokens)
        return [self.runner.capture_graphs(shapes, backend, "draft model")]

    def torch_modules(self) -> list[torch.nn.Module]:
        return [self.runner.model]

    def warm_up(self) -> None:
        """A catch-up of two tokens after a page of context, as each drafting step begins."""
        scratch_forward(self.runner, self.block_manager, 2, context_len=self.block_manager.block_size)

    # ---- drafting -------------------------------------------------------------------------------
    def prepare_draft_tokens(self, scheduled_requests: list, resources) -> dict[str, DraftProposal]:
        active = [(s.request, s.num_draft_slots) for s in scheduled_requests if self._sync(s.request)]
        drafts: dict[str, list[int]] = {r.request_id: [] for r, _ in active}
        probs: dict[str, list[torch.Tensor]] = {r.request_id: [] for r, _ in active}
        feeds = {r.request_id: r.token_ids[len(self._states[r.request_id].fed) :] for r, _ in active}
        grammars = {
            r.request_id: self.grammar_of(r).fork_for_drafting() for r, _ in active if self.grammar_of(r)
        }
        while active:
            active = [(r, n) for r, n in active if self._reserve(r, len(feeds[r.request_id]))]
            if not active:
                break
            logits = self._feed([(r, feeds[r.request_id]) for r, _ in active])
            # a request whose grammar is complete drafts no further
            active = [(r, n) for r, n in active if not _is_done(grammars.get(r.request_id))]
            if not active:
                break
            rows = torch.stack([logits[r.request_id] for r, _ in active])  # [R, vocab]
            matchers = [grammars.get(r.request_id) for r, _ in active]
            self._masks.apply(rows, matchers)  # draft-side masks: the drafts stay grammar-valid
            picks = self._pick_rows(rows, [r for r, _ in active])
            still = []
            for (r, n), matcher, (token, q) in zip(active, matchers, picks):
                if matcher is not None and not matcher.accept_token(token):
                    continue  # (cannot happen after the mask)
                drafts[r.request_id].append(token)
                if q is not None:
                    probs[r.request_id].append(q)
                feeds[r.request_id] = [token]
                if len(drafts[r.request_id]) < n:
                    still.append((r, n))
            active = still
        return {
            rid: DraftProposal(tokens, torch.stack(probs[rid]) if probs[rid] else None)
            for rid, tokens in drafts.items()
        }

    def _feed(self, items: list[tuple[object, list[int]]]) -> dict[str, torch.Tensor]:
        """Feed each request its tokens; the logits [vocab] after each one's last token. Forwards hold
        at most the runner's max_num_tokens tokens: a long catch-up is fed in chunks."""
        budget = self.runner.max_num_tokens
        logits: dict[str, torch.Tensor] = {}
        pending = [(r, list(tokens)) for r, tokens in items]
        while pending:
            seqs, fed, rest, used = [], [], [], 0
            for r, tokens in pending:
                take = min(len(tokens), budget - used)
                if take <= 0:
                    rest.append((r, tokens))
                    continue
                chunk, left = tokens[:take], tokens[take:]
                seqs.append(
                    SequenceInput(
                        chunk,
                        len(self._states[r.request_id].fed),
                        self.block_manager.block_tables[r.request_id],
                        0 if left else 1,
                    )
                )
                fed.append((r, chunk, not left))
                used += take
                if left:
                    rest.append((r, left))
            out = self.runner.forward(seqs)
            row = 0
            for r, chunk, done in fed:
                self._states[r.request_id].fed += chunk
                if done:
                    logits[r.request_id] = out.logits[row, : self.vocab_size]
                    row += 1
            pending = rest
        return logits

    def _sync(self, request) -> bool:
        """Rewind the draft cache to the longest prefix it shares with the verified tokens."""
        state = self._states.setdefault(request.request_id, _DraftState())
        keep = min(_common_prefix(state.fed, request.token_ids), len(request.token_ids) - 1)
        if request.request_id in self.block_manager.block_tables:
            self.block_manager.rewind(
                request.request_id, self.block_manager.num_slots[request.request_id] - keep
            )
        del state.fed[keep:]
        return True

    def _reserve(self, request, num_tokens: int) -> bool:
        """Pages for the next draft forward; a full draft pool ends this request's drafting early."""
        rid = request.request_id
        bm = self.block_manager
        if rid not in bm.block_tables:
            if not bm.can_allocate(num_tokens):
                return False
            bm.allocate(rid, num_tokens)
            return True
        if not bm.can_append(rid, num_tokens):
            return False
        bm.append(rid, num_tokens)
        return True

    def _pick_rows(self, rows: torch.Tensor, requests: list) -> list[tuple[int, torch.Tensor | None]]:
        """Each request's draft token from its row of ``rows`` [R, vocab]: greedy (one read back for every
        row), or sampled from q (kept for rejection sampling)."""
        greedy = rows.argmax(dim=-1).tolist()
        picks: list[tuple[int, torch.Tensor | None]] = []
        for i, request in enumerate(requests):
            params = request.sampling_params
            if not self.returns_draft_probs or params.is_greedy:
                picks.append((greedy[i], None))
                continue
            q = draft_distribution(rows[i], params)  # [vocab]
            picks.append((sample_from_probs(q, request.generator), q))
        return picks

    def release(self, request) -> None:
        self._states.pop(request.request_id, None)
        self.block_manager.free(request.request_id)


def _is_done(matcher) -> bool:
    return matcher is not None and matcher.is_terminated()


def _activation_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the model computes in (a quantized model's int8 buffers do not count)."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32
