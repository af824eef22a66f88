"""Tests for specexec.sampling.rejection: the verification step of speculative decoding.

Scenario tests pin the greedy rule and the edge cases; the statistical tests check the invariant
that makes speculative decoding lossless: with temperature > 0 the emitted tokens are distributed
exactly as the target's (filtered) distribution, whatever the drafts were.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from factories import logits_of, seeded
from scipy import stats  # (scipy is in the dev extra)
from specexec.sampling import SamplingParams, compute_probs
from specexec.sampling.rejection import PLACEHOLDER_TOKEN_ID, RejectionSampler, Verification
from specexec.sampling.spec_decode_metadata import SpecDecodeMetadata

VOCAB = 5
# Target distributions (before temperature) for k + 1 = 3 rows: the rows of two drafts and the one after.
TARGET_PROBS = [
    [0.35, 0.25, 0.20, 0.15, 0.05],
    [0.10, 0.40, 0.10, 0.30, 0.10],
    [0.20, 0.20, 0.20, 0.20, 0.20],
]
# A draft distribution q that differs from p on both draft rows.
DRAFT_PROBS = [
    [0.10, 0.40, 0.20, 0.10, 0.20],
    [0.30, 0.20, 0.20, 0.20, 0.10],
]
NUM_TRIALS = 20_000
P_VALUE_THRESHOLD = 1e-3


def make_params(temperature: float = 1.0, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=temperature, **kwargs)


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target's distribution p per row (float64), as the sampler defines it for `params`."""
    n = logits.shape[0]
    return compute_probs(
        logits,
        torch.full((n,), params.temperature),
        torch.full((n,), params.top_k, dtype=torch.long),
        torch.full((n,), params.top_p),
        torch.full((n,), params.min_p),
    ).double()


def verify(logits, drafts, params, draft_probs=None, generator=None) -> Verification:
    return RejectionSampler().verify(logits, drafts, draft_probs, params, generator)


def assert_distributed_as(tokens: list[int], probs: torch.Tensor) -> None:
    """Chi-square test that `tokens` are draws from `probs` [vocab]; tokens with p == 0 must never occur."""
    counts = torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=len(probs)).double()
    support = probs > 0
    assert counts[~support].sum() == 0, f"tokens outside the support were emitted: {counts.tolist()}"
    expected = probs[support] / probs[support].sum() * counts.sum()
    assert expected.min() >= 5, "too few samples for a chi-square test"
    p_value = stats.chisquare(counts[support].numpy(), expected.numpy()).pvalue
    assert p_value > P_VALUE_THRESHOLD, (
        f"p-value {p_value:.2e}: counts {counts.tolist()} vs expected {(probs * counts.sum()).tolist()}"
    )


# --- greedy: accept while draft == argmax ------------------------------------------------------------

GREEDY_LOGITS = logits_of(
    [
        [0.1, 0.1, 0.6, 0.1, 0.1],  # argmax 2
        [0.5, 0.2, 0.1, 0.1, 0.1],  # argmax 0
        [0.1, 0.1, 0.1, 0.1, 0.6],  # argmax 4
    ]
)


def test_perfect_match_emits_bonus_token() -> None:
    assert verify(GREEDY_LOGITS, [2, 0], make_params(0.0)) == Verification([2, 0, 4], 2)


def test_early_mismatch_emits_recovered_token() -> None:
    assert verify(GREEDY_LOGITS, [2, 3], make_params(0.0)) == Verification([2, 0], 1)


def test_all_rejected_emits_recovered_token() -> None:
    assert verify(GREEDY_LOGITS, [1, 0], make_params(0.0)) == Verification([2], 0)


def test_greedy_stops_at_first_mismatch_even_if_later_drafts_match() -> None:
    # Draft 1 (token 0) matches row 1's argmax, but draft 0 was already rejected.
    assert verify(GREEDY_LOGITS, [3, 0], make_params(0.0)) == Verification([2], 0)


def test_greedy_ignores_draft_probs() -> None:
    q = torch.full((2, VOCAB), 1 / VOCAB)
    assert verify(GREEDY_LOGITS, [2, 0], make_params(0.0), draft_probs=q) == Verification([2, 0, 4], 2)


def test_greedy_uses_exact_float64_argmax() -> None:
    # The two logits differ by 1e-12: equal in float32 (argmax would pick token 0), distinct in float64.
    logits = torch.tensor([[1.0, 1.0 + 1e-12, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    assert verify(logits, [1], make_params(0.0)) == Verification([1, 2], 1)


@pytest.mark.parametrize("bad", [VOCAB, 99, PLACEHOLDER_TOKEN_ID, -7])
def test_out_of_vocab_draft_is_rejected(bad: int) -> None:
    # Greedy: the target's argmax is emitted in place of the bad draft.
    assert verify(GREEDY_LOGITS, [2, bad], make_params(0.0)) == Verification([2, 0], 1)
    assert verify(GREEDY_LOGITS, [bad, 0], make_params(0.0)) == Verification([2], 0)
    # Sampled, deterministic drafts and drafts with q: rejected at that position, never emitted.
    logits = logits_of(TARGET_PROBS)
    q = torch.tensor(DRAFT_PROBS)
    for draft_probs in (None, q):
        for seed in range(50):
            v = verify(logits, [bad, 1], make_params(1.0), draft_probs, seeded(seed))
            assert v.num_accepted == 0 and len(v.token_ids) == 1 and 0 <= v.token_ids[0] < VOCAB


def test_zero_draft_tokens_samples_one() -> None:
    row = logits_of(TARGET_PROBS[:1])
    assert verify(GREEDY_LOGITS[:1], [], make_params(0.0)) == Verification([2], 0)
    for draft_probs in (None, torch.empty(0, VOCAB)):
        v = verify(row, [], make_params(1.0), draft_probs, seeded(0))
        assert v.num_accepted == 0 and len(v.token_ids) == 1 and 0 <= v.token_ids[0] < VOCAB
    # A seeded draw with no drafts is exactly the sampler's draw from p_0.
    expected = torch.multinomial(target_probs(row, make_params(1.0))[0].float(), 1, generator=seeded(3))
    assert verify(row, [], make_params(1.0), None, seeded(3)).token_ids == expected.tolist()


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="k \\+ 1"):
        verify(GREEDY_LOGITS, [2], make_params(0.0))
    with pytest.raises(ValueError, match="draft_probs"):
        verify(GREEDY_LOGITS, [2, 0], make_params(1.0), torch.full((1, VOCAB), 0.2))
    with pytest.raises(ValueError, match="rows"):
        RejectionSampler().verify_batch(
            GREEDY_LOGITS[:2], SpecDecodeMetadata.make_dummy([[2, 0]]), [make_params(0.0)], [None]
        )


# --- temperature > 0: edge cases -------------------------------------------------------------------


def test_sampled_draft_with_all_target_mass_is_always_accepted() -> None:
    # p_0 and p_1 put (numerically) all mass on the drafts: every path accepts both; bonus ~ p_2.
    logits = torch.tensor([[0.0, 0.0, 100.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0, 0.0], [0.0] * VOCAB])
    q = torch.tensor(DRAFT_PROBS)
    for draft_probs in (None, q):
        for seed in range(20):
            v = verify(logits, [2, 0], make_params(0.7), draft_probs, seeded(seed))
            assert v.num_accepted == 2 and v.token_ids[:2] == [2, 0]


def test_draft_with_zero_target_prob_is_always_rejected() -> None:
    logits = logits_of(TARGET_PROBS)
    logits[0, 3] = float("-inf")  # p_0[3] == 0
    for draft_probs in (None, torch.tensor(DRAFT_PROBS)):
        for seed in range(50):
            v = verify(logits, [3, 1], make_params(1.0), draft_probs, seeded(seed))
            assert v.num_accepted == 0 and v.token_ids[0] != 3


def test_zero_draft_prob_is_rejected() -> None:
    # The drafter says q_0[1] == 0 yet proposed token 1: rejected, and the token comes from p_0.
    q = torch.tensor(DRAFT_PROBS)
    q[0] = torch.tensor([0.25, 0.0, 0.25, 0.25, 0.25])
    for seed in range(50):
        v = verify(logits_of(TARGET_PROBS), [1, 1], make_params(1.0), q, seeded(seed))
        assert v.num_accepted == 0 and len(v.token_ids) == 1


def test_all_zero_residual_falls_back_to_target_probs() -> None:
    # q = 2 p (not normalised): every draft is accepted with prob 1/2, and the residual max(p - q, 0)
    # is all zero, so the recovered token must come from p itself.
    logits = logits_of(TARGET_PROBS)
    q = 2 * target_probs(logits, make_params(1.0))[:2].float()
    outcomes = [verify(logits, [0, 1], make_params(1.0), q, seeded(seed)) for seed in range(200)]
    assert {v.num_accepted for v in outcomes} == {0, 1, 2}
    assert all(0 <= t < VOCAB for v in outcomes for t in v.token_ids)


def test_seeded_verification_is_reproducible() -> None:
    logits = logits_of(TARGET_PROBS)
    for draft_probs in (None, torch.tensor(DRAFT_PROBS)):
        first = [verify(logits, [0, 1], make_params(0.9), draft_probs, seeded(s)) for s in range(30)]
        again = [verify(logits, [0, 1], make_params(0.9), draft_probs, seeded(s)) for s in range(30)]
        assert first == again
        assert len({tuple(v.token_ids) for v in first}) > 1  # the seed matters


@pytest.mark.parametrize("use_q", [False, True])
def test_top_k_filtered_tokens_are_never_emitted(use_q: bool) -> None:
    # top_k = 2 keeps tokens {0, 1} in row 0, {1, 3} in row 1 and {0, 1} in row 2 (ties -> lowest ids).
    # The drafts and q favour the filtered tokens; none of them may come out.
    params = make_params(1.0, top_k=2)
    logits = logits_of(TARGET_PROBS)
    allowed = [{0, 1}, {1, 3}, {0, 1}]
    q = torch.tensor([[0.05, 0.05, 0.3, 0.3, 0.3], [0.05, 0.05, 0.3, 0.3, 0.3]])
    generator, draft_generator = seeded(11), seeded(12)
    for _ in range(2000):
        if use_q:
            drafts = [int(torch.multinomial(q[i], 1, generator=draft_generator)) for i in range(2)]
            v = verify(logits, drafts, params, q, generator)
        else:
            v = verify(logits, [2, 4], params, None, generator)
        assert all(t in allowed[i] for i, t in enumerate(v.token_ids)), v


# --- batches -----------------------------------------------------------------------------------------


def test_batch_matches_per_request() -> None:
    torch.manual_seed(0)
    requests = [  # (drafts, draft_probs, params, seed)
        ([2, 0], None, make_params(0.0), None),
        ([1, 3, 0], None, make_params(0.8, top_p=0.9), 1),
        ([], None, make_params(0.0), None),
        ([0, 1], torch.tensor(DRAFT_PROBS), make_params(1.0), 2),
        ([4], None, make_params(0.0), None),
        ([], None, make_params(1.2, min_p=0.1), 3),
        ([3, 3], torch.tensor(DRAFT_PROBS), make_params(0.5, top_k=3), 4),
    ]
    cu_rows = [0]
    for drafts, *_ in requests:
        cu_rows.append(cu_rows[-1] + len(drafts) + 1)
    logits = torch.randn(cu_rows[-1], VOCAB, dtype=torch.float64)

    sampler = RejectionSampler()
    for _ in range(20):
        seeds = torch.randint(0, 2**31, (len(requests),)).tolist()
        expected = [
            sampler.verify(logits[cu_rows[i] : cu_rows[i + 1]], d, q, p, seeded(seeds[i]))
            for i, (d, q, p, _) in enumerate(requests)
        ]
        meta = SpecDecodeMetadata.build([d for d, *_ in requests], [q for _, q, _, _ in requests], VOCAB)
        got = sampler.verify_batch(logits, meta, [p for _, _, p, _ in requests], [seeded(s) for s in seeds])
        assert got == expected


def test_batch_of_greedy_requests_takes_one_argmax() -> None:
    logits = torch.cat([GREEDY_LOGITS, GREEDY_LOGITS[1:], GREEDY_LOGITS[2:]])
    meta = SpecDecodeMetadata.make_dummy([[2, 0], [0], []])
    got = RejectionSampler().verify_batch(logits, meta, [make_params(0.0)] * 3, [None] * 3)
    assert got == [Verification([2, 0, 4], 2), Verification([0, 4], 1), Verification([4], 0)]
    assert RejectionSampler().verify_batch(logits[:0], SpecDecodeMetadata.make_dummy([]), [], []) == []


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_unreadable_rows_cut_the_drafts_before_them(temperature: float) -> None:
    # Request 0: row 2 is NaN, so only draft 0 is verified (by row 0) and row 1 gives the next token.
    # Request 1: its first row is +inf: no tokens, and it says why. Request 2: every logit -inf.
    good = logits_of([[0.0, 0.0, 100.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0, 0.0]])
    nan = torch.full((1, VOCAB), float("nan"))
    inf = torch.tensor([[0.0, float("inf"), 0.0, 0.0, 0.0]])
    none = torch.full((1, VOCAB), float("-inf"))
    logits = torch.cat([good, nan, good[1:], inf, good[:1], none])
    meta = SpecDecodeMetadata.make_dummy([[2, 0, 3], [1], []])
    params = [make_params(temperature)] * 3
    got = RejectionSampler().verify_batch(logits, meta, params, [seeded(0)] * 3)
    assert got[0] == Verification([2, 0], 1)
    assert got[1] == Verification([], 0, "+inf")
    assert got[2] == Verification([], 0, "-inf")


def test_greedy_decode_rows_without_drafts_say_each_rows_status() -> None:
    # No request has drafts and none samples (the short path): each row's argmax, or why it has none.
    good = logits_of([[0.0, 0.0, 100.0, 0.0, 0.0]])
    nan = torch.full((1, VOCAB), float("nan"))
    inf = torch.tensor([[0.0, float("inf"), 0.0, 0.0, 0.0]])
    none = torch.full((1, VOCAB), float("-inf"))
    logits = torch.cat([good, nan, inf, none, good])
    meta = SpecDecodeMetadata.make_dummy([[]] * 5)
    got = RejectionSampler().verify_batch(logits, meta, [make_params(0.0)] * 5, [None] * 5)
    assert got[0] == got[4] == Verification([2], 0)
    assert got[1:4] == [Verification([], 0, why) for why in ("nan", "+inf", "-inf")]


def test_a_step_reads_its_answers_back_once(monkeypatch) -> None:
    # The whole batch's answers come back in one transfer, whatever the mix of greedy and sampled.
    calls = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: calls.append(t.shape) or real(t))
    monkeypatch.setattr(torch.Tensor, "item", lambda t: pytest.fail("a per-token host sync"))
    logits = logits_of(TARGET_PROBS * 3)
    meta = SpecDecodeMetadata.build([[0, 1], [1, 2], [3, 4]], [None, torch.tensor(DRAFT_PROBS), None], VOCAB)
    params = [make_params(0.0), make_params(1.0), make_params(0.7, top_k=3)]
    RejectionSampler().verify_batch(logits, meta, params, [seeded(1), seeded(2), seeded(3)])
    assert len(calls) == 1


# --- the invariant: with temperature > 0, the output is distributed as the target ---------------------


def check_positions(outcomes: list[Verification], p: torch.Tensor) -> None:
    """Token j (given at least j + 1 tokens came out, i.e. the first j drafts were accepted) ~ p_j."""
    for j in range(p.shape[0]):
        tokens = [v.token_ids[j] for v in outcomes if len(v.token_ids) > j]
        assert_distributed_as(tokens, p[j])


@pytest.mark.parametrize(
    "params", [make_params(1.0), make_params(0.7, top_p=0.9)], ids=["temperature-1", "temperature-0.7-top-p"]
)
def test_deterministic_drafts_keep_target_distribution(params: SamplingParams) -> None:
    logits = logits_of(TARGET_PROBS)
    generator = seeded(1234)
    drafts = [0, 1]  # a fixed draft, as from an n-gram drafter
    outcomes = [verify(logits, drafts, params, None, generator) for _ in range(NUM_TRIALS)]
    # A second token only follows an accepted first draft.
    assert all(v.token_ids[: v.num_accepted] == drafts[: v.num_accepted] for v in outcomes)
    check_positions(outcomes, target_probs(logits, params))


@pytest.mark.parametrize(
    "params", [make_params(1.0), make_params(0.7, top_p=0.9)], ids=["temperature-1", "temperature-0.7-top-p"]
)
def test_draft_probs_keep_target_distribution(params: SamplingParams) -> None:
    logits = logits_of(TARGET_PROBS)
    p = target_probs(logits, params)
    q = torch.tensor(DRAFT_PROBS)
    generator, draft_generator = seeded(4321), seeded(8765)
    # The theory needs d_i ~ q_i: draw every trial's drafts from q (independently per row).
    drafts = torch.stack(
        [torch.multinomial(q[i], NUM_TRIALS, replacement=True, generator=draft_generator) for i in range(2)],
        dim=1,
    ).tolist()  # NUM_TRIALS x [2]
    outcomes = [verify(logits, d, params, q, generator) for d in drafts]
    check_positions(outcomes, p)

    # And the first draft is accepted with probability sum_x min(p_0(x), q_0(x)).
    num_first_accepted = sum(v.num_accepted >= 1 for v in outcomes)
    accept_rate = float(torch.minimum(p[0], q[0].double()).sum())
    assert stats.binomtest(num_first_accepted, NUM_TRIALS, accept_rate).pvalue > P_VALUE_THRESHOLD
    assert Counter(v.num_accepted for v in outcomes).keys() == {0, 1, 2}


def test_a_batch_without_drafts_has_its_metadata_built_once_and_as_built_with_drafts_absent() -> None:
    # Every plain decode step of a batch size reads the same metadata: shared, and equal to a fresh build.
    first = SpecDecodeMetadata.build([[], [], []])
    assert SpecDecodeMetadata.build([[]] * 3, [None] * 3, VOCAB) is first
    fresh = SpecDecodeMetadata._build([[]] * 3, [0] * 3, None, None, "cpu")
    for name in SpecDecodeMetadata.__slots__:
        a, b = getattr(first, name), getattr(fresh, name)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, name
    assert first.padded_rows.tolist() == [[0], [1], [2]]
    assert SpecDecodeMetadata.build([[], [5]]).num_draft_tokens == [0, 1]  # drafts: built as before
