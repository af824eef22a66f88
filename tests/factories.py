"""What many test folders build or check the same way: one copy of each, imported from here.

- configs: `tiny_config` (the float64 tiny-model settings), `drafting_config` (the same, no drafter unless
  named, and a named one drafting every step; `drafting_every_step` for a spec alone);
- executors: `tiny_executor`, a tiny random model under `tiny_config`;
- requests: `greedy` (greedy sampling params), `greedy_requests`, `schema_format` (a JSON-schema
  ``response_format``);
- logits: `logits_of` (logits whose softmax is given), `seeded` (a seeded CPU generator);
- checks: `assert_all_pages_free`, the page-accounting invariant after every request ended (target and
  draft caches, reference counts equal to their holders, nothing left in the scheduler);
- `free_port`: a loopback port no one listens on, for tests that start servers or ranks.
"""

from __future__ import annotations

import socket

import torch
from specexec import ExecutorConfig
from specexec.executor.engine.request import Request
from specexec.executor.executor import Executor
from specexec.sampling import SamplingParams
from tiny_models import make_tiny_model

#: what the float64 tiny-model tests run with unless a test says otherwise
TINY_SETTINGS = dict(
    num_kv_blocks=128, block_size=4, max_num_tokens=128, max_batch_size=8, dtype="float64", device="cpu"
)


def tiny_config(**overrides) -> ExecutorConfig:
    """An ExecutorConfig for a tiny random model: TINY_SETTINGS with ``overrides`` on top."""
    return ExecutorConfig(**{**TINY_SETTINGS, **overrides})


def drafting_every_step(spec):
    """``spec`` with ``draft_len_policy: fixed`` where it names no policy. Tests of what verification
    makes of drafts want every step to draft, as the "auto" policy (the default) would not where a drafter
    costs about what the tiny target does, or where timing it on a busy machine says so."""
    if isinstance(spec, dict) and "draft_len_policy" not in spec:
        return {**spec, "draft_len_policy": "fixed"}
    return spec


def drafting_config(**overrides) -> ExecutorConfig:
    """`tiny_config` without a drafter unless ``speculative_config`` names one, which then drafts every
    step (`drafting_every_step`)."""
    spec = drafting_every_step(overrides.pop("speculative_config", None))
    return tiny_config(**overrides, speculative_config=spec)


def tiny_executor(
    arch: str = "llama", *, drafter=None, tokenizer=None, model_overrides: dict | None = None, **config
) -> Executor:
    """An Executor over a tiny random ``arch`` model (`make_tiny_model` with ``model_overrides``) under
    ``tiny_config(**config)``."""
    _, model = make_tiny_model(arch, **(model_overrides or {}))
    return Executor(model, tiny_config(**config), drafter=drafter, tokenizer=tokenizer)


def greedy(max_tokens: int, **params) -> SamplingParams:
    """Greedy sampling params for ``max_tokens`` tokens, EOS ignored unless ``params`` say otherwise."""
    params.setdefault("ignore_eos", True)
    return SamplingParams(max_tokens=max_tokens, **params)


def greedy_requests(prompts: list[list[int]], max_tokens) -> list[Request]:
    """Greedy requests ``r0``, ``r1``, ... (EOS ignored); ``max_tokens`` is one number or one per prompt."""
    if isinstance(max_tokens, int):
        max_tokens = [max_tokens] * len(prompts)
    return [Request(p, greedy(m), request_id=f"r{i}") for i, (p, m) in enumerate(zip(prompts, max_tokens))]


def schema_format(schema: dict, name: str | None = None) -> dict:
    """A ``response_format`` holding the output to ``schema`` (under ``name``, where given)."""
    return {"type": "json_schema", "json_schema": {**({"name": name} if name else {}), "schema": schema}}


def logits_of(probs, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[rows, vocab] logits whose softmax (at temperature 1) is ``probs``: one row of probabilities gives
    [1, vocab]."""
    logits = torch.tensor(probs, dtype=torch.float64).log().to(dtype)
    return logits[None] if logits.dim() == 1 else logits


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_all_pages_free(executor: Executor) -> None:
    """Every KV page back in the free pool (cached pages no one holds count as free), for the target and
    for a draft model's own cache."""
    bm = executor.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "target pages leaked"
    assert not bm.block_tables and not bm.num_slots
    bm.check_references()
    assert not executor.core.scheduler.has_unfinished()
    draft_bm = getattr(executor.speculation.drafter, "block_manager", None)
    if draft_bm is not None:
        assert draft_bm.num_free_blocks == draft_bm.num_blocks, "draft model pages leaked"
        assert not draft_bm.block_tables and not draft_bm.num_slots


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
