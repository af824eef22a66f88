"""Tests for specexec.sampling: parameters, logit filters and the batch sampler."""

from __future__ import annotations

import math

import pytest
import torch
from factories import logits_of, seeded
from specexec.sampling import Sampler, SamplingParams, apply_sampling_filters, compute_probs
from specexec.sampling.sampler import sample_from_probs

TINY_PROBS = [0.5, 0.3, 0.15, 0.05]


def filter_rows(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> torch.Tensor:
    """apply_sampling_filters with the same parameters on every row."""
    n = logits.shape[0]
    return apply_sampling_filters(
        logits,
        torch.full((n,), temperature),
        torch.full((n,), top_k, dtype=torch.long),
        torch.full((n,), top_p),
        torch.full((n,), min_p),
    )


def kept(filtered_row: torch.Tensor) -> set[int]:
    return set(torch.isfinite(filtered_row).nonzero().flatten().tolist())


# --- filters on a hand-written vocabulary ---------------------------------------------------------


@pytest.mark.parametrize(
    ("top_k", "expected"), [(0, {0, 1, 2, 3}), (1, {0}), (2, {0, 1}), (3, {0, 1, 2}), (4, {0, 1, 2, 3})]
)
def test_top_k_keeps_the_k_most_likely(top_k: int, expected: set[int]) -> None:
    assert kept(filter_rows(logits_of(TINY_PROBS), top_k=top_k)[0]) == expected


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [(0.3, {0}), (0.7, {0, 1}), (0.9, {0, 1, 2}), (0.99, {0, 1, 2, 3}), (1.0, {0, 1, 2, 3})],
)
def test_top_p_keeps_smallest_set_reaching_top_p(top_p: float, expected: set[int]) -> None:
    assert kept(filter_rows(logits_of(TINY_PROBS), top_p=top_p)[0]) == expected


@pytest.mark.parametrize(
    ("min_p", "expected"),
    [(0.0, {0, 1, 2, 3}), (0.05, {0, 1, 2, 3}), (0.2, {0, 1, 2}), (0.5, {0, 1}), (0.7, {0}), (1.0, {0})],
)
def test_min_p_drops_tokens_below_fraction_of_max(min_p: float, expected: set[int]) -> None:
    assert kept(filter_rows(logits_of(TINY_PROBS), min_p=min_p)[0]) == expected


def test_top_p_stops_as_soon_as_mass_reaches_top_p_exactly() -> None:
    # Four equal logits: probs are exactly 0.25 each, so two tokens reach top_p = 0.5 exactly.
    assert kept(filter_rows(torch.zeros(1, 4), top_p=0.5)[0]) == {0, 1}
    assert kept(filter_rows(torch.zeros(1, 4), top_p=0.25)[0]) == {0}


def test_top_p_applies_after_top_k_on_renormalised_mass() -> None:
    # top_k=2 leaves [0.5, 0.3] -> renormalised [0.625, 0.375]; top_p=0.6 then keeps only token 0.
    assert kept(filter_rows(logits_of(TINY_PROBS), top_k=2, top_p=0.6)[0]) == {0}
    assert kept(filter_rows(logits_of(TINY_PROBS), top_p=0.6)[0]) == {0, 1}


def test_min_p_applies_after_top_k_on_renormalised_probs() -> None:
    # Relative threshold: renormalising does not change ratios, so top_k=3, min_p=0.5 keeps {0, 1}.
    assert kept(filter_rows(logits_of(TINY_PROBS), top_k=3, min_p=0.5)[0]) == {0, 1}


def test_filters_work_on_unsorted_vocabulary() -> None:
    logits = logits_of([0.15, 0.05, 0.5, 0.3])
    assert kept(filter_rows(logits, top_k=2)[0]) == {2, 3}
    assert kept(filter_rows(logits, top_p=0.7)[0]) == {2, 3}
    assert kept(filter_rows(logits, min_p=0.2)[0]) == {0, 2, 3}


def test_kept_logits_are_unchanged_apart_from_temperature() -> None:
    logits = logits_of(TINY_PROBS)
    out = filter_rows(logits, temperature=2.0, top_k=3)
    torch.testing.assert_close(out[0, :3], logits[0, :3] / 2.0)
    assert out[0, 3] == float("-inf")


def test_argmax_survives_the_harshest_filters() -> None:
    generator = seeded(0)
    logits = torch.randn(64, 1000, generator=generator) * 5  # [64, 1000]
    out = filter_rows(logits, temperature=0.01, top_k=1, top_p=1e-6, min_p=1.0)
    rows = torch.arange(64)
    assert torch.isfinite(out[rows, logits.argmax(dim=-1)]).all()
    assert (torch.isfinite(out).sum(dim=-1) == 1).all()


def test_argmax_survives_ties_at_the_top() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    assert kept(filter_rows(logits, top_k=1)[0]) == {1}
    assert kept(filter_rows(logits, top_p=0.01)[0]) == {1}


def test_filters_are_per_row_in_one_vectorised_call() -> None:
    logits = logits_of(TINY_PROBS).repeat(4, 1)  # [4, 4]
    out = apply_sampling_filters(
        logits,
        torch.tensor([1.0, 1.0, 1.0, 0.0]),
        torch.tensor([0, 2, 0, 0]),
        torch.tensor([1.0, 1.0, 0.7, 1.0]),
        torch.tensor([0.0, 0.0, 0.0, 0.2]),
    )
    assert [kept(row) for row in out] == [{0, 1, 2, 3}, {0, 1}, {0, 1}, {0, 1, 2}]


def test_no_filters_keeps_whole_large_vocabulary_without_sorting(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sort(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.sort called although no row uses top_k/top_p")

    monkeypatch.setattr(torch, "sort", no_sort)
    logits = torch.randn(3, 49152, generator=seeded(1), dtype=torch.float64)  # [3, 49152]
    out = filter_rows(logits)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_top_p_one_keeps_tail_when_another_row_sorts() -> None:
    # Row 1 forces the sort path; row 0 (top_p=1) must not lose tail tokens to cumsum rounding.
    logits = torch.randn(2, 49152, generator=seeded(2)) * 10  # [2, 49152]
    out = apply_sampling_filters(
        logits, torch.ones(2), torch.zeros(2, dtype=torch.long), torch.tensor([1.0, 0.5]), torch.zeros(2)
    )
    assert torch.isfinite(out[0]).all()
    assert not torch.isfinite(out[1]).all()


def test_temperature_zero_rows_are_left_unscaled() -> None:
    logits = logits_of(TINY_PROBS)
    torch.testing.assert_close(filter_rows(logits, temperature=0.0), logits)


# --- temperature and probabilities -------------------------------------------------------------


def test_compute_probs_matches_tiny_distribution_at_temperature_one() -> None:
    probs = compute_probs(
        logits_of(TINY_PROBS),
        torch.ones(1),
        torch.zeros(1, dtype=torch.long),
        torch.ones(1),
        torch.zeros(1),
    )
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs[0], torch.tensor(TINY_PROBS))


def test_compute_probs_renormalises_after_filtering() -> None:
    probs = compute_probs(
        logits_of(TINY_PROBS), torch.ones(1), torch.tensor([2]), torch.ones(1), torch.zeros(1)
    )
    torch.testing.assert_close(probs[0], torch.tensor([0.625, 0.375, 0.0, 0.0]))


@pytest.mark.parametrize("temperature", [0.25, 0.5, 2.0, 4.0])
def test_temperature_scales_logits_before_softmax(temperature: float) -> None:
    logits = logits_of(TINY_PROBS)
    probs = compute_probs(
        logits, torch.tensor([temperature]), torch.zeros(1, dtype=torch.long), torch.ones(1), torch.zeros(1)
    )
    torch.testing.assert_close(probs, torch.softmax(logits / temperature, dim=-1))


def test_low_temperature_sharpens_and_high_temperature_flattens() -> None:
    logits = logits_of(TINY_PROBS).repeat(3, 1)  # [3, 4]
    probs = compute_probs(
        logits,
        torch.tensor([0.5, 1.0, 2.0]),
        torch.zeros(3, dtype=torch.long),
        torch.ones(3),
        torch.zeros(3),
    )
    top = probs[:, 0]
    assert top[0] > top[1] > top[2]
    assert probs[2].min() > probs[1].min() > probs[0].min()


# --- Sampler ------------------------------------------------------------------------------------


def test_greedy_picks_argmax() -> None:
    logits = torch.randn(5, 300, generator=seeded(3))  # [5, 300]
    tokens = Sampler().sample(logits, [SamplingParams()] * 5, [None] * 5)
    assert tokens.dtype == torch.long
    assert tokens.tolist() == logits.argmax(dim=-1).tolist()


def test_greedy_uses_raw_float64_logits() -> None:
    # Indistinguishable in float32; float64 knows token 2 wins.
    logits = torch.tensor([[0.0, 1.0, 1.0 + 1e-12, 0.5]], dtype=torch.float64)
    assert torch.tensor(1.0 + 1e-12, dtype=torch.float32) == 1.0
    assert Sampler().sample(logits, [SamplingParams()], [None]).tolist() == [2]


def test_top_k_one_always_samples_argmax() -> None:
    logits = torch.randn(4, 500, generator=seeded(4))  # [4, 500]
    params = [SamplingParams(temperature=1.5, top_k=1)] * 4
    for seed in range(20):
        tokens = Sampler().sample(logits, params, [seeded(seed + i) for i in range(4)])
        assert tokens.tolist() == logits.argmax(dim=-1).tolist()


def test_same_seed_gives_same_tokens() -> None:
    logits = torch.zeros(1, 1000)  # flat
    params = SamplingParams(temperature=1.0, seed=1234)

    def draw_sequence() -> list[int]:
        generator = params.make_generator("cpu")
        return [Sampler().sample(logits, [params], [generator]).item() for _ in range(50)]

    assert draw_sequence() == draw_sequence()


def test_different_seeds_give_different_sequences() -> None:
    logits = torch.zeros(1, 1000)  # flat
    sequences = []
    for seed in (1, 2):
        params = SamplingParams(temperature=1.0, seed=seed)
        generator = params.make_generator("cpu")
        sequences.append([Sampler().sample(logits, [params], [generator]).item() for _ in range(50)])
    assert sequences[0] != sequences[1]


def test_each_row_uses_its_own_generator() -> None:
    logits = torch.zeros(2, 1000)  # flat
    params = [SamplingParams(temperature=1.0)] * 2
    both = Sampler().sample(logits, params, [seeded(7), seeded(8)])
    alone = Sampler().sample(logits[1:], params[1:], [seeded(8)])
    assert both[1].item() == alone[0].item()


def test_sampling_matches_distribution_chi_square() -> None:
    n = 20000
    probs = torch.tensor(TINY_PROBS)
    logits = logits_of(TINY_PROBS).repeat(n, 1)  # [n, 4]
    params = [SamplingParams(temperature=1.0)] * n
    torch.manual_seed(0)  # rows without a generator use the global RNG
    tokens = Sampler().sample(logits, params, [None] * n)
    observed = torch.bincount(tokens, minlength=4).double()
    expected = probs.double() * n
    statistic = float(((observed - expected) ** 2 / expected).sum())
    try:
        from scipy.special import chdtri  # lighter import than scipy.stats
    except ImportError:
        # chi-square critical value for 3 degrees of freedom at p = 0.001.
        critical = 16.266
    else:
        critical = float(chdtri(len(TINY_PROBS) - 1, 1e-3))
    assert statistic < critical, (observed.tolist(), expected.tolist())
    # A wrong distribution (e.g. temperature applied twice) would be far outside this.
    assert math.isclose(observed[0].item() / n, 0.5, abs_tol=0.02)


def test_mixed_batch_of_greedy_and_sampled_rows() -> None:
    logits = torch.zeros(4, 1000)  # flat, so greedy rows pick token 0 ...
    logits[:, 999] = 0.5  # ... unless the argmax is moved: token 999 for every row
    params = [
        SamplingParams(),
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.0, top_k=5),
    ]
    generators = [None, seeded(1), seeded(2), None]
    tokens = Sampler().sample(logits, params, generators)
    assert tokens[0].item() == 999
    assert tokens[1].item() == 999
    assert tokens[3].item() == 999
    expected_row2 = sample_from_probs(torch.softmax(logits[2], dim=-1), seeded(2))
    assert tokens[2].item() == expected_row2


def test_sampler_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="one SamplingParams and one generator per row"):
        Sampler().sample(torch.zeros(2, 4), [SamplingParams()], [None, None])


def test_sample_from_probs_accepts_unnormalised_weights() -> None:
    weights = torch.tensor([0.0, 0.0, 3.0, 0.0])
    assert sample_from_probs(weights, seeded(0)) == 2
    assert Sampler.sample_from_probs(weights, None) == 2


# --- SamplingParams -------------------------------------------------------------------------------


def test_defaults_are_valid_and_greedy() -> None:
    params = SamplingParams()
    params.validate()
    assert params.is_greedy
    assert not SamplingParams(temperature=0.7).is_greedy


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -1),
        ("max_tokens", 1.5),
        ("max_tokens", True),
        ("temperature", -0.1),
        ("temperature", float("inf")),
        ("temperature", float("nan")),
        ("temperature", "hot"),
        ("top_k", -1),
        ("top_k", 2.0),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", float("nan")),
        ("min_p", -0.1),
        ("min_p", 1.1),
        ("seed", 1.5),
        ("seed", "42"),
        ("seed", 2**64),
        ("stop", [""]),
        ("stop", ["ok", 3]),
        ("stop", 3),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", ["2"]),
        ("stop_token_ids", 5),
        ("ignore_eos", "yes"),
    ],
)
def test_validate_names_the_bad_field(field: str, value: object) -> None:
    params = SamplingParams(**{field: value})  # construction never raises
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        params.validate()


def test_validate_accepts_boundary_values() -> None:
    SamplingParams(max_tokens=1, temperature=0, top_k=0, top_p=1.0, min_p=1.0, seed=0).validate()
    SamplingParams(top_p=1e-9, min_p=0.0, seed=-5, stop=["\n"], stop_token_ids=[0, 2]).validate()


def test_stop_string_and_tuples_are_normalised_to_lists() -> None:
    params = SamplingParams(stop="END", stop_token_ids=(1, 2))
    assert params.stop == ["END"]
    assert params.stop_token_ids == [1, 2]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]


def test_from_dict_builds_and_validates() -> None:
    params = SamplingParams.from_dict({"temperature": 0.8, "top_p": 0.9, "stop": "\n\n", "seed": 3})
    assert params == SamplingParams(temperature=0.8, top_p=0.9, stop=["\n\n"], seed=3)
    with pytest.raises(ValueError, match="^top_p must be"):
        SamplingParams.from_dict({"top_p": 0})


def test_from_dict_rejects_unknown_keys_and_lists_allowed_ones() -> None:
    with pytest.raises(ValueError, match="'temprature'") as excinfo:
        SamplingParams.from_dict({"temprature": 0.5})
    message = str(excinfo.value)
    assert "allowed:" in message
    assert "temperature" in message
    assert "max_tokens" in message


def test_make_generator_is_seeded_or_none() -> None:
    assert SamplingParams().make_generator("cpu") is None
    first = SamplingParams(seed=99).make_generator("cpu")
    second = SamplingParams(seed=99).make_generator(torch.device("cpu"))
    assert first is not None and second is not None
    assert torch.equal(torch.rand(5, generator=first), torch.rand(5, generator=second))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_draw_token_is_multinomials_draw_for_the_same_generator_state(dtype):
    """`draw_token` runs multinomial's own one-sample algorithm without its host-side checks: the same
    tokens, draw for draw, so seeded requests are reproducible across the change."""
    from specexec.sampling.sampler import draw_token

    probs = torch.rand(500, dtype=dtype, generator=torch.Generator().manual_seed(1))
    probs[::4] = 0  # tokens that can never come out
    ours, theirs = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    drawn = [int(draw_token(probs, ours)) for _ in range(300)]
    assert drawn == [int(torch.multinomial(probs, 1, generator=theirs)) for _ in range(300)]
    assert all(t % 4 for t in drawn)


def test_filters_decided_on_the_host_give_the_probabilities_read_from_the_device():
    from specexec.sampling import compute_probs
    from specexec.sampling.params import filter_flags

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    rows = [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(temperature=0.9, min_p=0.1),
    ]
    for chosen in (rows[:1], rows):
        n = len(chosen)
        args = (
            logits[:n],
            torch.tensor([p.temperature for p in chosen]),
            torch.tensor([p.top_k for p in chosen]),
            torch.tensor([p.top_p for p in chosen]),
            torch.tensor([p.min_p for p in chosen]),
        )
        flags = filter_flags(chosen, 50)
        assert flags == {"has_top_k_top_p": n > 1, "has_min_p": n > 1}
        assert torch.equal(compute_probs(*args, **flags), compute_probs(*args))
