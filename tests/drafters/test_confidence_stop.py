"""The "confidence" draft-length rule: one more draft while its expected tokens per second beat the
step's so far, on a forward cost curve (`executor/confidence_stop.py`)."""

from __future__ import annotations

import pytest
from specexec.executor.engine.speculation.confidence_stop import ChainOdds, ConfidenceStop
from specexec.executor.engine.speculation.draft_length import ForwardCostModel

FLAT = ForwardCostModel([1, 64], [1.0, 1.0])  #: extra tokens are free
FULL = ForwardCostModel([1, 2], [1.0, 2.0])  #: each token costs a whole forward
QUARTER = ForwardCostModel([1, 2], [1.0, 1.25])  #: each extra token costs a quarter forward


def chain_of(*confidences: float) -> ChainOdds:
    chain = ChainOdds()
    for c in confidences:
        chain.keep(c)
    return chain


def test_chain_odds_multiply_and_sum():
    chain = chain_of(0.9, 0.5)
    assert chain.num_drafts == 2
    assert chain.accepted == pytest.approx(0.45)
    assert chain.expected == pytest.approx(1 + 0.9 + 0.45)


def test_free_drafts_are_always_kept_unless_certainly_wrong():
    rule = ConfidenceStop(FLAT)
    assert rule.keeps(chain_of(0.1, 0.1, 0.1), 0.01, batch_size=1)
    assert not rule.keeps(ChainOdds(), 0.0, batch_size=1)


def test_drafts_never_pay_when_each_token_costs_a_whole_forward():
    rule = ConfidenceStop(FULL)
    assert not rule.keeps(ChainOdds(), 0.99, batch_size=1)


@pytest.mark.parametrize("confidence, kept", [(0.26, True), (0.24, False)])
def test_first_draft_pays_above_the_marginal_cost_of_one_token(confidence, kept):
    # E_0 = 1 token for T_0 = 1; the draft adds c tokens for 0.25 more: it pays when c > 0.25
    assert ConfidenceStop(QUARTER).keeps(ChainOdds(), confidence, batch_size=1) is kept


@pytest.mark.parametrize("confidence, kept", [(0.5, True), (0.4, False)])
def test_later_drafts_must_beat_the_rate_of_the_chain_so_far(confidence, kept):
    # after one draft of 0.9: E = 1.9 tokens for T = 1.25; the next adds 0.9c for 0.25 more,
    # which pays when 0.9c * 1.25 > 1.9 * 0.25, i.e. c > 0.422
    assert ConfidenceStop(QUARTER).keeps(chain_of(0.9), confidence, batch_size=1) is kept


def test_a_slow_drafter_ends_chains_sooner():
    fast, slow = ConfidenceStop(QUARTER), ConfidenceStop(QUARTER, draft_step_seconds=0.3)
    assert fast.keeps(ChainOdds(), 0.4, batch_size=1)  # 0.4 * 1 > 1 * 0.25
    assert not slow.keeps(ChainOdds(), 0.4, batch_size=1)  # 0.4 * 1.3 < 1 * (0.25 + 0.3)


def test_a_batch_shares_the_forward():
    # one forward over 8 tokens costs 1, over 16 tokens 3: a batch of 8 pays 2/8 per request for a draft
    curve = ForwardCostModel([1, 8, 16], [1.0, 1.0, 3.0])
    rule = ConfidenceStop(curve)
    assert rule.step_seconds(0, batch_size=8) == pytest.approx(1 / 8)
    assert rule.step_seconds(1, batch_size=8) == pytest.approx(3 / 8)
    assert not rule.keeps(ChainOdds(), 0.9, batch_size=8)  # 0.9 * 1/8 < 2/8
    assert rule.keeps(ChainOdds(), 0.9, batch_size=1)  # alone, its draft rides a flat curve


def test_draft_step_time_is_a_running_estimate():
    rule = ConfidenceStop(QUARTER, smoothing=0.5)
    rule.time_draft_step(0.2)
    assert rule.draft_step_seconds == pytest.approx(0.2)
    rule.time_draft_step(0.4)
    assert rule.draft_step_seconds == pytest.approx(0.3)
