"""`TextOdds`: the chance that a request's next prompt-lookup draft is accepted, from the text drafts the
target judged in its earlier chains, pulled toward the rate over all requests."""

from __future__ import annotations

import pytest
from specexec.drafters.eagle3.text_odds import TextOdds


def test_with_no_evidence_the_chance_is_even():
    assert TextOdds().estimate("r") == pytest.approx(0.5)


@pytest.mark.parametrize(
    "chain, num_accepted, judged, accepted",
    [
        pytest.param([True, True, True], 3, 3, 3, id="all-accepted"),
        pytest.param([True, True, True], 1, 2, 1, id="second-rejected-third-unseen"),
        pytest.param([False, True, True], 0, 0, 0, id="head-draft-rejected-text-unseen"),
        pytest.param([False, True, False], 1, 1, 0, id="head-draft-accepted-text-rejected"),
        pytest.param([False, True, False], 3, 1, 1, id="only-text-drafts-count"),
    ],
)
def test_a_chain_counts_the_text_drafts_the_target_saw(chain, num_accepted, judged, accepted):
    odds = TextOdds()
    odds.record_chain("r", chain)
    odds.observe("r", num_accepted)
    assert (odds._requests["r"].judged, odds._requests["r"].accepted) == (judged, accepted)
    assert (odds._all.judged, odds._all.accepted) == (judged, accepted)


def test_a_request_that_copies_its_text_earns_a_high_estimate_and_others_start_from_the_overall_rate():
    odds = TextOdds(prior_weight=4.0)
    for _ in range(20):
        odds.record_chain("copier", [True, True, True])
        odds.observe("copier", 3)
    assert odds.estimate("copier") > 0.9
    # a new request: the rate over all requests so far, (60 + 1) / (60 + 2)
    assert odds.estimate("new") == pytest.approx(61 / 62)
    for _ in range(20):
        odds.record_chain("other", [True, True])
        odds.observe("other", 0)  # its first text draft is rejected every time
    assert odds.estimate("other") < 0.3 < odds.estimate("copier")


def test_a_chain_without_text_drafts_or_not_verified_counts_nothing_and_release_forgets():
    odds = TextOdds()
    odds.record_chain("r", [True])
    odds.record_chain("r", [False, False])  # the next step drafted from the head only
    odds.observe("r", 2)
    assert odds._all.judged == 0
    odds.observe("r", 1)  # no chain recorded since: nothing to count
    assert odds._all.judged == 0
    odds.record_chain("r", [True])
    odds.observe("r", 1)
    odds.forget("r")
    assert "r" not in odds._requests and odds._all.judged == 1
