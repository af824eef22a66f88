"""The `Drafter` base class: what every drafter (built-in or plugin) implements.

A drafter proposes up to ``max_draft_len`` tokens per decoding request each step; the target verifies
them in one forward. The executor reaches drafters only through the pluggy hook relay: the
``specexec_*`` methods below are the hook implementations and call the plain methods a subclass
overrides (``propose``, or ``prepare_draft_tokens`` for batched drafters).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from ..grammar.request_grammar import grammar_valid_prefix
from ..plugins import hookimpl
from ..sampling import compute_probs, device_tensor
from ..sampling.params import filter_flags

__all__ = [
    "DraftBinding",
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
    """What a drafter factory gets, besides its options, to build a drafter."""

    target_model: torch.nn.Module  #: the target model (a draft may share its embeddings or copy it)
    tokenizer: object | None  #: the target's tokenizer
    vocab_size: int  #: the target's vocabulary size
    executor_config: object  #: the ExecutorConfig (dtype, device, KV budget, block size)
    target_path: Path | None = None  #: the file or directory the target was loaded from (None: a module)
    max_draft_len: int = 3  #: ``speculative_config.max_draft_len``: the most drafts per request per step


@dataclass(frozen=True, slots=True)
class DraftBinding:
    """What the executor decides for one run and hands a drafter once, when it binds it
    (`Drafter.bind_target`): the target it drafts for and how. A drafter reads it as ``self.binding``
    (or through `Drafter.draft_tree`, `Drafter.confidence_stop`, `Drafter.use_grammar_masks`); nothing
    else is written onto a drafter after it is built, so one passed in again binds afresh."""

    runner: object = None  #: the target's `ModelRunner` (LayerSkip runs its layers on its KV cache)
    block_manager: object = None  #: the target's `BlockManager`
    #: False turns draft-side grammar masks off (``draft_side_grammar_masks``, for the ablation)
    use_grammar_masks: bool = True
    #: with ``speculative_config.draft_tree``: the `TreeShape` to draft within (``num_draft_slots`` then
    #: still answers a depth; the scheduled slots are the tree's nodes); None: chains
    draft_tree: object = None
    #: under draft_len_policy "confidence", for a drafter that ``reports_confidence``: the
    #: `ConfidenceStop` that ends each chain where one more draft does not pay; else None
    confidence_stop: object = None


def options_from(options_type: type, options, fields: dict):
    """A drafter constructor's options: ``options`` (an ``options_type``) or ``fields`` (its fields as
    keyword arguments), not both; neither: the defaults."""
    if options is not None and fields:
        raise TypeError(f"pass either a {options_type.__name__} or its fields as keyword arguments, not both")
    if options is None:
        return options_type(**fields)
    if not isinstance(options, options_type):
        raise TypeError(f"options must be a {options_type.__name__}, got {type(options).__name__}")
    return options


def option_fields(options) -> dict:
    """An options dataclass as keyword arguments."""
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


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
    """Decorator for a drafter factory ``make(options, context)``: the dataclass of its options
    (``speculative_config`` keys other than decoding_type, max_draft_len, draft_len_schedule and
    draft_len_policy). The executor parses them into it once, before any model loads, so an unknown key
    or a bad value fails at once, and hands the factory that object; decorate the dataclass with
    ``specexec.executor.engine.options.reject_unknown_keys`` for a clear unknown-key error. A factory
    that declares none gets the options as the mapping the config holds."""

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
    #: its calls run on the loop's thread instead of the guard's (no thread hop: on CPU a second thread's
    #: OpenMP team slows a drafter's model by about a quarter); the deadline is then checked when a call
    #: returns, and a call that never returns cannot be cut short. The built-in drafters set it.
    runs_on_loop_thread: bool = False
    #: it ends each request's chain early when ``confidence_stop`` says one more draft does not pay,
    #: judged by its own confidence (draft_len_policy "confidence"; others fall back to "auto")
    reports_confidence: bool = False
    #: after each verifying forward, ``request.target_tokens`` holds its drafts and the target's greedy
    #: token at each of their rows (the root's first), read at the next call (Lookahead's Jacobi iterate)
    wants_target_tokens: bool = False
    #: the drafter's own estimate of how often a draft is accepted, where it measured one (LayerSkip at
    #: start-up): the draft-length policy's first estimate for every request (None: the policy's own)
    initial_acceptance: float | None = None
    #: the tree shape ``draft_tree: true`` takes (a `tree_config.TreeShape`); None: it drafts chains only
    default_tree = None
    #: what the executor decided for this run (`DraftBinding`), given by `bind_target`; None: not bound
    binding: DraftBinding | None = None

    @property
    def use_grammar_masks(self) -> bool:
        """Whether guided requests' drafts are masked by their grammar (the binding's; True unbound)."""
        return self.binding is None or self.binding.use_grammar_masks

    @property
    def draft_tree(self):
        """The `TreeShape` to draft within, under ``speculative_config.draft_tree``; None: chains."""
        return None if self.binding is None else self.binding.draft_tree

    @property
    def confidence_stop(self):
        """The `ConfidenceStop` under draft_len_policy "confidence" (a drafter that reports confidence
        ends each chain with it); None otherwise."""
        return None if self.binding is None else self.binding.confidence_stop

    def grammar_of(self, request):
        """This step's snapshot of the request's grammar (``fork_for_drafting()``, ``is_terminated()``)
        when draft-side masks are on and the request is guided, else None. It is the drafter's own: the
        request's matcher is never handed to a drafter."""
        return getattr(request, "drafting_grammar", None) if self.use_grammar_masks else None

    def __init__(self, max_draft_len: int) -> None:
        if not isinstance(max_draft_len, int) or not 1 <= max_draft_len <= 32:
            raise ValueError(f"max_draft_len must be an integer in 1..32, got {max_draft_len!r}")
        self.max_draft_len = max_draft_len
        self.binding = None  #: set by `bind_target` only

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

    def bind_target(self, binding: DraftBinding) -> None:
        """Called once at start-up, after the target's kernels, graphs and forward costs are settled,
        with what the executor decided for this run; binding again replaces it. A drafter that runs the
        target's own layers on its KV cache (LayerSkip) overrides it to set itself up on
        ``binding.runner``, calling this one too."""
        self.binding = binding

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
