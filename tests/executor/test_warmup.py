"""``warmup``: one tiny forward of each model at start-up (and the grammar compiler's set-up), outside
every metric. It must run each model, leave no page held, no statistic counted, no drafter state, and
change no output."""

from __future__ import annotations

import pytest
import torch
from eagle3_heads import eagle_spec, make_head_dir
from factories import assert_all_pages_free, drafting_config, greedy_requests
from specexec.drafters.eagle3.drafter import Eagle3Drafter
from specexec.executor.executor import Executor
from specexec.executor.model.model_runner import ModelRunner
from speculative_runs import BATCHES, MAX_TOKENS, SELF_DRAFT_SPEC, reference, run_speculative
from tiny_models import make_tiny_model, save_tiny_model_dir

SPECS = {
    "ngram": lambda tmp_path: {"decoding_type": "NGram", "max_draft_len": 3},
    "self_draft": lambda tmp_path: SELF_DRAFT_SPEC,
    "eagle": lambda tmp_path: (make_head_dir(tmp_path), eagle_spec(tmp_path))[1],
}


@pytest.fixture
def forward_counts(monkeypatch):
    """Forwards per model: each ModelRunner by identity, and the EAGLE-3 head."""
    counts: dict[object, int] = {}
    runner_forward, head_forward = ModelRunner.forward, Eagle3Drafter._forward

    def counting_runner(self, *args, **kwargs):
        counts[self] = counts.get(self, 0) + 1
        return runner_forward(self, *args, **kwargs)

    def counting_head(self, *args, **kwargs):
        counts["head"] = counts.get("head", 0) + 1
        return head_forward(self, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "forward", counting_runner)
    monkeypatch.setattr(Eagle3Drafter, "_forward", counting_head)
    return counts


@pytest.mark.parametrize("name", list(SPECS))
def test_warmup_runs_each_model_and_leaves_no_trace(tmp_path, name, forward_counts):
    def check_after_warmup(executor: Executor) -> None:
        assert executor.setup.warmup_seconds is not None and executor.setup.warmup_seconds > 0
        drafter = executor.speculation.drafter
        target = executor.core.runner
        assert forward_counts.pop(target) == 2, "the target runs a decode and a verify shape"
        draft_runner = getattr(drafter, "runner", None)
        if draft_runner is not None:
            assert forward_counts.pop(draft_runner) == 1
        if name == "eagle":
            assert forward_counts.pop("head") == 1
        assert not forward_counts, f"forwards of no model: {forward_counts}"
        assert_all_pages_free(executor)
        stats = executor.speculation.stats
        assert (stats.num_draft_steps, stats.num_draft_tokens, stats.num_target_forwards) == (0, 0, 0)
        assert stats.drafting_time == stats.target_time == 0.0
        assert executor.guided.stats.num_steps == 0
        pool = getattr(drafter, "_shared", None)
        if pool is not None:
            assert len(pool) == 0, "the NGram pool learnt from the warm-up"

    # greedy outputs equal the reference without drafts and without warm-up; all pages free after
    run_speculative(
        "llama",
        BATCHES["batch8"],
        speculative_config=SPECS[name](tmp_path),
        warmup=True,
        before_run=check_after_warmup,
    )


def test_warmup_without_a_drafter_runs_the_target_once_and_changes_nothing(forward_counts):
    _, model = make_tiny_model("llama")
    executor = Executor(model, drafting_config(warmup=True))
    assert forward_counts.pop(executor.core.runner) == 1 and not forward_counts
    outputs = executor.run(greedy_requests(BATCHES["batch8"], MAX_TOKENS))
    assert [o.token_ids for o in outputs] == reference("llama", BATCHES["batch8"])
    assert all(o.metrics.num_forwards > 0 for o in outputs)
    assert_all_pages_free(executor)


def test_warmup_sets_up_the_grammar_compiler_outside_its_statistics(tmp_path):
    path = save_tiny_model_dir(tmp_path / "tiny")
    executor = Executor(config=drafting_config(model=path, dtype="float32", warmup=True, progress=False))
    pool = executor.guided._pool
    assert pool is not None, "the compiler's tokenizer tables were not built"
    assert pool.num_compiles == 0 and not pool.compile_times_ms and pool.num_hits == 0
    assert_all_pages_free(executor)


def test_warmup_is_off_unless_asked():
    _, model = make_tiny_model("llama")
    executor = Executor(model, drafting_config())
    assert executor.setup.warmup_seconds is None and executor.guided._pool is None
    with pytest.raises(ValueError, match="warmup"):
        drafting_config(warmup="yes")


def test_cpu_kv_pool_is_zeros_without_writing_them():
    """The pool is zero-filled (a page no request wrote reads as 0, never NaN) and writable."""
    from specexec.executor.model.kv_cache import zeroed_pool

    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        pool = zeroed_pool((3, 2, 40, 2, 8), dtype, torch.device("cpu"))
        assert pool.shape == (3, 2, 40, 2, 8) and pool.dtype == dtype and pool.is_contiguous()
        assert torch.count_nonzero(pool) == 0
        pool[1, 0, 5] = 2.0
        assert pool.sum().item() == 2 * 2 * 8
