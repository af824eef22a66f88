"""The `Drafter` base class: what every drafter (built-in or plugin) implements.

A drafter proposes up to ``max_draft_len`` tokens per decoding request each step; the target verifies
them in one forward. The executor reaches drafters only through the pluggy hook relay: the
``specexec_*`` methods below are the hook implementations and call the plain methods a subclass
overrides (``propose``, or ``prepare_draft_tokens`` for batched drafters).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..grammar.request_grammar import grammar_valid_prefix
from ..plugins import hookimpl
from ..sampling import compute_probs, device_tensor
from ..sampling.params import filter_flags

__all__ = [
    "DraftProposal",
    "Drafter",
    "DrafterContext",
    "declare_options",
    "draft_distribution",
    "grammar_valid_prefix",
]


@dataclass(slots=True)
class DraftProposal:
    """One request's drafts for one step."""

    token_ids: list[int]  #: at most the request's reserved draft slots
    probs: torch.Tensor | None = None  # [len(token_ids), vocab] draft distribution q, for rejection sampling
    #: a token tree (`sampling/tree_shape.py`): each draft's parent, -1 for the root (the token after the
    #: last verified one); None: a chain. Trees are verified without q (`sampling/tree_verify.py`).
    parents: list[int] | None = None


@dataclass(slots=True)
class DrafterContext:
    """What a drafter factory gets to build a drafter."""

    target_model: torch.nn.Module  #: the target model (a draft may share its embeddings or copy it)
    tokenizer: object | None  #: the target's tokenizer
    vocab_size: int  #: the target's vocabulary size
    executor_config: object  #: the ExecutorConfig (dtype, device, KV budget, block size)
    target_path: Path | None = None  #: the file or directory the target was loaded from (None: a module)


def draft_distribution(logits: torch.Tensor, params) -> torch.Tensor:
    """q: the request's sampling distribution (temperature, top-k/p, min-p) over ``logits`` [vocab]."""
    dev = logits.device
    return compute_probs(
        logits[None],
        device_tensor([params.temperature], torch.float32, dev),
        device_tensor([params.top_k], torch.long, dev),
        device_tensor([params.top_p], torch.float32, dev),
        device_tensor([params.min_p], torch.float32, dev),
        **filter_flags([params], logits.shape[-1]),
    )[0]  # [vocab]


def declare_options(options_type: type):
    """Decorator for a drafter factory: the dataclass of its options (``speculative_config`` keys other
    than decoding_type, max_draft_len, draft_len_schedule and draft_len_policy). The executor builds it
    from the config before any model loads, so an unknown key or a bad value fails at once; decorate
    the dataclass with ``specexec.executor.options.reject_unknown_keys`` for a clear unknown-key error."""

    def mark(factory):
        factory.options = options_type
        return factory

    return mark


class Drafter:
    """Base class of drafters. Subclasses set the capability flags and override `propose`."""

    #: drafts are a deterministic function of the context (verified by sampling p and comparing)
    is_deterministic: bool = True
    #: proposals carry the draft distribution q (verified with min(1, p/q) rejection sampling)
    returns_draft_probs: bool = False
    #: the drafter applies grammar masks to its own drafting steps
    accepts_grammar_masks: bool = False
    #: target `hidden_states` indices (transformers numbering) it reads from the verifying forward
    hidden_state_layers: tuple[int, ...] = ()
    #: it keeps a KV cache of its own (rewound with the target's)
    owns_kv_cache: bool = False
    #: set by the executor: False turns draft-side grammar masks off (for the ablation)
    use_grammar_masks: bool = True
    #: its calls run on the loop's thread instead of the guard's (no thread hop: on CPU a second thread's
    #: OpenMP team slows a drafter's model by about a quarter); the deadline is then checked when a call
    #: returns, and a call that never returns cannot be cut short. The built-in drafters set it.
    runs_on_loop_thread: bool = False
    #: it ends each request's chain early when ``confidence_stop`` says one more draft does not pay,
    #: judged by its own confidence (draft_len_policy "confidence"; others fall back to "auto")
    reports_confidence: bool = False
    #: set by the executor under draft_len_policy "confidence" (an `executor.confidence_stop.ConfidenceStop`)
    confidence_stop = None
    #: after each verifying forward, ``request.target_tokens`` holds its drafts and the target's greedy
    #: token at each of their rows (the root's first), read at the next call (Lookahead's Jacobi iterate)
    wants_target_tokens: bool = False
    #: the drafter's own estimate of how often a draft is accepted, where it measured one (LayerSkip at
    #: start-up): the draft-length policy's first estimate for every request (None: the policy's own)
    initial_acceptance: float | None = None
    #: the tree shape ``draft_tree: true`` takes (a `tree_config.TreeShape`); None: it drafts chains only
    default_tree = None
    #: set by the executor when ``speculative_config.draft_tree`` is on: the `TreeShape` to draft within
    #: (``num_draft_slots`` then still answers a depth; the scheduled slots are the tree's nodes)
    draft_tree = None

    def grammar_of(self, request):
        """This step's snapshot of the request's grammar (``fork_for_drafting()``, ``is_terminated()``)
        when draft-side masks are on and the request is guided, else None. It is the drafter's own: the
        request's matcher is never handed to a drafter."""
        return getattr(request, "drafting_grammar", None) if self.use_grammar_masks else None

    def __init__(self, max_draft_len: int) -> None:
        if not isinstance(max_draft_len, int) or not 1 <= max_draft_len <= 32:
            raise ValueError(f"max_draft_len must be an integer in 1..32, got {max_draft_len!r}")
        self.max_draft_len = max_draft_len

    # ---- what subclasses override -------------------------------------------------------------
    def num_draft_slots(self, request) -> int:
        """Draft slots to reserve for this request this step (0 = decode without drafts)."""
        return self.max_draft_len

    def propose(self, request, num_slots: int, resources) -> DraftProposal:
        """Draft tokens for one request, at most ``num_slots``."""
        raise NotImplementedError(f"{type(self).__name__} must override propose() or prepare_draft_tokens()")

    def prepare_draft_tokens(self, scheduled_requests: list, resources) -> dict[str, DraftProposal]:
        """Draft for every scheduled request (batched drafters override this); keyed by request id."""
        return {
            s.request.request_id: self.propose(s.request, s.num_draft_slots, resources)
            for s in scheduled_requests
        }

    def on_verified(self, request, num_accepted: int) -> None:
        """Feedback after verification (dynamic draft length, cache bookkeeping)."""

    def release(self, request) -> None:
        """Forget a finished or preempted request."""

    def forget_finished_requests(self) -> None:
        """Forget what finished requests taught it (a drafter that learns from earlier outputs, as
        Suffix's shared index does): benchmarks start each run cold. Nothing to forget by default."""

    def bind_target(self, runner, block_manager) -> None:
        """Called once at start-up with the target's runner (`ModelRunner`) and block manager, for a drafter
        that runs the target's own layers on its KV cache (LayerSkip). The others need nothing."""

    def capture_cuda_graphs(self, backend, max_batch_size: int, max_model_len: int) -> list:
        """Capture the models this drafter runs every step (called once at start-up on CUDA, after the
        target's graphs, with the executor's capture ``backend``); returns their
        `GraphCaptureReport`s. A drafter without a model of its own captures nothing."""
        return []

    def torch_modules(self) -> list[torch.nn.Module]:
        """The models this drafter runs (the executor repacks their linear layers for the CPU when
        ``cpu_linear`` picks oneDNN). A drafter without a model of its own has none."""
        return []

    def warm_up(self) -> None:
        """One tiny forward of each model this drafter runs, over scratch pages it frees at once (called
        at start-up with ``warmup`` on, so that the first request pays no cold start). A drafter
        without a model of its own does nothing."""

    # ---- hook implementations (the executor calls these through the plugin manager) ------------
    @hookimpl
    def specexec_prepare_draft_requests(self, requests: list) -> dict[str, int]:
        return {r.request_id: min(self.num_draft_slots(r), self.max_draft_len) for r in requests}

    @hookimpl
    def specexec_prepare_draft_tokens(self, scheduled_requests: list, resources) -> dict[str, DraftProposal]:
        return self.prepare_draft_tokens(scheduled_requests, resources)

    @hookimpl
    def specexec_on_verified(self, request, num_accepted: int) -> None:
        self.on_verified(request, num_accepted)

    @hookimpl
    def specexec_release_request(self, request) -> None:
        self.release(request)
