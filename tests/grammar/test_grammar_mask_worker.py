"""MaskWorker: rows and flags of one step, overlap timing, error propagation."""

from __future__ import annotations

import time

import pytest
import torch
from grammar_support import VALID_JSON, VOCAB, encode, reference_mask, schema_grammar
from specexec.grammar import MaskJob, MaskWorker, RequestGrammar, RowFill


@pytest.fixture
def worker():
    w = MaskWorker(max_rows=12, vocab_size=VOCAB)
    yield w
    w.close()


class SlowGrammar:
    """Stands in for a RequestGrammar: sleeps (no CPU) or raises inside fill_rows."""

    def __init__(self, seconds: float = 0.0, error: Exception | None = None) -> None:
        self.seconds, self.error = seconds, error

    def fill_rows(self, bitmask, row0, drafts):
        time.sleep(self.seconds)
        if self.error is not None:
            raise self.error
        bitmask[row0] = 0
        return RowFill(1, 0, None, False)


def test_fills_the_right_rows_and_flags(worker):
    ids = encode(VALID_JSON)
    bad = encode("hello")[0]
    a, c = RequestGrammar(schema_grammar()), RequestGrammar(schema_grammar())
    c.accept_now(ids[:3])
    # rows: A 0-3 (3 drafts), unconstrained request 4-6, C 7-9 (draft 1 invalid), padding 10
    jobs = [MaskJob(a, 0, tuple(ids[:3])), MaskJob(c, 7, (ids[3], bad, ids[5]))]
    worker.start(jobs, num_rows=11)
    res = worker.wait()
    assert res.bitmask.shape == (11, (VOCAB + 31) // 32) and res.bitmask.dtype == torch.int32
    assert res.needs_mask.tolist() == [1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0]
    assert res.fills == [RowFill(4, 3, None, False), RowFill(2, 1, 1, False)]
    for r in range(4):
        assert torch.equal(res.bitmask[r], reference_mask(schema_grammar(), ids[:r])[0])
    for r in range(2):
        assert torch.equal(res.bitmask[7 + r], reference_mask(schema_grammar(), ids[: 3 + r])[0])
    assert (res.bitmask[[4, 5, 6, 9, 10]] == -1).all()  # unfilled rows allow everything
    assert res.build_ms >= 0 and res.wait_ms >= 0

    a.after_verification(1, ids[1])  # next step: flags of the previous step are cleared
    worker.start([MaskJob(a, 2, ())], num_rows=4)
    res = worker.wait()
    assert res.needs_mask.tolist() == [0, 0, 1, 0]
    assert torch.equal(res.bitmask[2], reference_mask(schema_grammar(), ids[:2])[0])


def test_wait_time_measures_the_missing_overlap(worker):
    worker.start([MaskJob(SlowGrammar(0.05), 0, ())], num_rows=1)
    res = worker.wait()  # nothing to overlap with: we wait for the whole build
    assert res.build_ms >= 45 and res.wait_ms >= 30
    worker.start([MaskJob(SlowGrammar(0.02), 0, ())], num_rows=1)
    time.sleep(0.15)  # the "target forward"
    res = worker.wait()
    assert res.build_ms >= 15 and res.wait_ms < 10


def test_a_failing_job_is_reported_alone_and_the_worker_survives(worker):
    worker.start(
        [MaskJob(SlowGrammar(error=KeyError("boom")), 0, ()), MaskJob(SlowGrammar(), 1, ())], num_rows=2
    )
    result = worker.wait()
    assert result.fills[0] is None and "boom" in result.errors[0]
    assert result.fills[1] is not None and result.errors[1] is None
    assert result.needs_mask.tolist() == [0, 1]  # the failed job's row is left unmasked
    worker.start([MaskJob(SlowGrammar(), 1, ())], num_rows=2)
    assert worker.wait().needs_mask.tolist() == [0, 1]


def test_protocol_errors(worker):
    with pytest.raises(RuntimeError, match="without start"):
        worker.wait()
    g = SlowGrammar()
    with pytest.raises(ValueError, match="overlap"):
        worker.start([MaskJob(g, 0, (1, 2)), MaskJob(g, 2, ())], num_rows=4)
    with pytest.raises(ValueError, match="exceed"):
        worker.start([MaskJob(g, 3, (1,))], num_rows=4)
    with pytest.raises(ValueError, match="num_rows"):
        worker.start([], num_rows=13)
    worker.start([], num_rows=0)
    with pytest.raises(RuntimeError, match="before wait"):
        worker.start([], num_rows=0)
    assert worker.wait().fills == []


def test_build_overlaps_a_forward_on_the_main_thread(worker):
    """A few full steps: start, run a small matmul, wait, verify (all drafts accepted)."""
    ids = encode(VALID_JSON)
    rg = RequestGrammar(schema_grammar())
    x = torch.randn(128, 128)
    pos = 0
    while pos + 3 < len(ids):
        worker.start([MaskJob(rg, 0, tuple(ids[pos : pos + 2]))], num_rows=3)
        _ = x @ x
        res = worker.wait()
        assert res.fills[0] == RowFill(3, 2, None, False)
        rg.after_verification(2, ids[pos + 2])
        pos += 3
    scratch = torch.zeros(1, (VOCAB + 31) // 32, dtype=torch.int32)
    rg.fork_for_drafting().fill_next_token_bitmask(scratch)
    assert torch.equal(scratch[0], reference_mask(schema_grammar(), ids[:pos])[0])
