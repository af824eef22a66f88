"""Dynamic draft length (executor/draft_length.py): the forward cost model, the policy's choice of k
from acceptance and cost, probing after a collapse, the acceptance estimate, and the on-disk cache of
measured costs. Plus the executor's "auto" policy set-up on a tiny model.

Cost curves are real CPU measurements of one model (milliseconds per forward over n tokens): in
bfloat16 the forward is weight-bound and nearly flat in n, in float32 it grows steeply.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import random
import types

import pytest
import torch
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.request import Request
from specexec.executor.engine.speculation.draft_length import DraftLengthPolicy, ForwardCostModel
from specexec.executor.executor import Executor
from specexec.executor.kernel_plan import forward_cost
from specexec.executor.kernel_plan.forward_cost import (
    MEASURED_SIZES,
    cost_cache_key,
    measure_forward_cost,
    stored_forward_cost,
)
from specexec.executor.kernel_plan.measurement import store as measurement_cache
from specexec.executor.kernel_plan.measurement.store import NOISE_FIELD
from specexec.executor.layers.cpu_info import describe_cpu
from specexec.executor.layers.measurement.cache_folder import default_cache_dir
from specexec.executor.layers.packed_linear import RowBands, pack_linears, unpack_linears
from specexec.sampling import SamplingParams
from tiny_models import make_tiny_model

BF16_LIKE = ForwardCostModel([1, 4, 8, 16], [76.5, 78.0, 85.1, 88.8])
FP32_LIKE = ForwardCostModel([1, 4, 8, 16], [55.7, 115.7, 142.7, 151.9])


def make_policy(cost_model=BF16_LIKE, max_draft_len: int = 8, rate: float | None = None, **kwargs):
    policy = DraftLengthPolicy(max_draft_len, cost_model, **kwargs)
    if rate is not None:
        policy.initial_rate = rate
    return policy


def choose_one(policy: DraftLengthPolicy, request_id: str = "r", batch_size: int = 1, **kwargs) -> int:
    """One request's draft length in a step of batch_size rows where it alone may draft."""
    return policy.choose({request_id: policy.max_draft_len}, batch_size, **kwargs)[request_id]


def value_of(cost_model, chosen: dict[str, int], rates: dict[str, list[float]], batch: int, draft_cost=0.0):
    """Expected tokens per unit of cost of one step, written out from the module docstring."""
    expected = batch + sum(sum(math.prod(rates[rid][: i + 1]) for i in range(k)) for rid, k in chosen.items())
    num_drafts = sum(chosen.values())
    return expected / (cost_model.cost(batch + num_drafts) + num_drafts * draft_cost)


def best_value_by_search(cost_model, rates: dict[str, list[float]], max_k: int, batch: int, draft_cost=0.0):
    """The best value over every combination of draft lengths (small batches only)."""
    ids = list(rates)
    return max(
        value_of(cost_model, dict(zip(ids, ks)), rates, batch, draft_cost)
        for ks in itertools.product(range(max_k + 1), repeat=len(ids))
    )


def set_rates(policy: DraftLengthPolicy, request_id: str, rates: list[float]) -> None:
    policy.expected_tokens(request_id, 0)  # creates its state
    policy._requests[request_id].rates[:] = rates


def collapse(policy: DraftLengthPolicy, request_id: str, steps: int = 30) -> None:
    for _ in range(steps):
        policy.observe(request_id, num_drafts=4, num_accepted=0)


# ---- ForwardCostModel ---------------------------------------------------------------------------------


def test_cost_model_returns_measured_points_exactly():
    for n, seconds in zip(FP32_LIKE.num_tokens, FP32_LIKE.seconds):
        assert FP32_LIKE.cost(n) == pytest.approx(seconds)


def test_cost_model_interpolates_linearly_between_measured_points():
    assert FP32_LIKE.cost(2) == pytest.approx(55.7 + (115.7 - 55.7) / 3)
    assert FP32_LIKE.cost(6) == pytest.approx((115.7 + 142.7) / 2)
    assert FP32_LIKE.cost(12) == pytest.approx((142.7 + 151.9) / 2)
    costs = [FP32_LIKE.cost(n) for n in range(1, 17)]
    assert costs == sorted(costs), "a monotone curve must interpolate monotonically"


def test_cost_model_clamps_below_and_extrapolates_the_last_slope_above():
    assert FP32_LIKE.cost(0) == pytest.approx(55.7)
    assert FP32_LIKE.cost(-3) == pytest.approx(55.7)
    slope = (151.9 - 142.7) / 8
    assert FP32_LIKE.cost(24) == pytest.approx(151.9 + 8 * slope)
    assert FP32_LIKE.cost(64) == pytest.approx(151.9 + 48 * slope)


def test_linear_cost_model_charges_a_quarter_forward_per_extra_token():
    model = ForwardCostModel.linear()
    assert model.cost(1) == pytest.approx(1.0)
    assert model.cost(2) == pytest.approx(1.25)
    assert model.cost(9) == pytest.approx(3.0)
    assert ForwardCostModel.linear(0.5).cost(5) == pytest.approx(3.0)


def test_a_step_with_a_measured_decode_batch_prices_the_drafts_at_the_curves_increment():
    model = ForwardCostModel(
        [1, 4, 8, 16], [1.0, 1.5, 2.0, 4.0], batch_sizes=[1, 8], batch_seconds=[1.0, 3.0]
    )
    assert model.step_cost(8, 0) == pytest.approx(3.0)  # the decode step of 8 sequences, as measured
    assert model.step_cost(8, 8) == pytest.approx(3.0 + 4.0 - 2.0)  # plus 8 rows at the curve's price
    assert model.step_cost(4, 0) == pytest.approx(1.0 + 2.0 * 3 / 7)  # interpolated between batch sizes
    unmeasured = ForwardCostModel([1, 4, 8, 16], [1.0, 1.5, 2.0, 4.0])
    assert unmeasured.step_cost(8, 8) == pytest.approx(4.0), "without decode batches: the curve alone"


def test_a_batch_whose_decode_step_costs_more_than_the_curve_says_drafts_more():
    """At 8 requests each attends over its own context: the decode step costs more than one sequence's
    forward over 8 tokens, so the same drafts are a smaller share of the step."""
    curve = dict(num_tokens=[1, 8, 16, 32], seconds=[1.0, 2.4, 4.2, 7.2])
    batches = {f"r{i}": 3 for i in range(8)}
    without = make_policy(ForwardCostModel(**curve), max_draft_len=3, rate=0.8, probe_interval=10**6)
    with_batches = make_policy(
        ForwardCostModel(**curve, batch_sizes=[1, 8], batch_seconds=[1.0, 3.8]),
        max_draft_len=3,
        rate=0.8,
        probe_interval=10**6,
    )
    assert sum(without.choose(batches, 8).values()) < sum(with_batches.choose(batches, 8).values())


# ---- choosing the draft lengths --------------------------------------------------------------------------

STEEP = ForwardCostModel([1, 2, 4, 8, 16], [1.0, 1.4, 2.2, 4.0, 7.8])  # compute-bound: ~linear in rows


@pytest.mark.parametrize("cost_model", [BF16_LIKE, FP32_LIKE, STEEP], ids=["bf16", "fp32", "steep"])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("draft_cost", [0.0, 0.3])
def test_choice_is_the_best_combination_of_draft_lengths(cost_model, seed, batch, draft_cost):
    generator = random.Random(seed)
    policy = make_policy(cost_model, max_draft_len=4, probe_interval=10**6)
    rates = {f"r{i}": [generator.choice([0.0, 0.3, 0.6, 0.9, 1.0]) for _ in range(4)] for i in range(batch)}
    for rid, request_rates in rates.items():
        set_rates(policy, rid, request_rates)
    draft_cost *= cost_model.cost(1)
    chosen = policy.choose(dict.fromkeys(rates, 4), batch, draft_cost_per_token=draft_cost)
    assert all(0 <= k <= 4 for k in chosen.values())
    best = best_value_by_search(cost_model, rates, 4, batch, draft_cost)
    assert value_of(cost_model, chosen, rates, batch, draft_cost) == pytest.approx(best, rel=1e-9)


def test_choice_keeps_to_each_requests_slots():
    policy = make_policy(ForwardCostModel([1, 64], [1.0, 1.0]), rate=0.99)
    assert policy.choose({"a": 2, "b": 5, "c": 0}, batch_size=4) == {"a": 2, "b": 5, "c": 0}


def test_high_acceptance_on_a_flat_cost_curve_drafts_the_maximum():
    assert choose_one(make_policy(BF16_LIKE, rate=0.9)) == 8


def test_steep_cost_curve_drafts_less_than_a_flat_one():
    flat = choose_one(make_policy(BF16_LIKE, rate=0.6))
    steep = choose_one(make_policy(FP32_LIKE, rate=0.6))
    assert steep == 1 and flat >= 4


def test_higher_acceptance_drafts_longer():
    choices = [choose_one(make_policy(BF16_LIKE, rate=r)) for r in (0.2, 0.4, 0.6, 0.8, 0.95)]
    assert choices == sorted(choices) and choices[0] < choices[-1]


def test_drafter_time_per_token_shortens_the_drafts():
    free = choose_one(make_policy(BF16_LIKE, rate=0.8), draft_cost_per_token=0.0)
    costly = choose_one(make_policy(BF16_LIKE, rate=0.8), draft_cost_per_token=10.0)
    assert costly < free


def test_a_bigger_batch_on_a_compute_bound_curve_drafts_less_or_not_at_all():
    totals = []
    for batch in (1, 2, 4, 8):
        policy = make_policy(STEEP, max_draft_len=3, rate=0.6, probe_interval=10**6)
        chosen = policy.choose({f"r{i}": 3 for i in range(batch)}, batch)
        totals.append(sum(chosen.values()) / batch)
    assert totals == sorted(totals, reverse=True) and totals[0] > 0 and totals[-1] == 0, totals


def test_drafts_go_to_the_requests_that_accept_them():
    policy = make_policy(STEEP, max_draft_len=3, probe_interval=10**6)
    set_rates(policy, "predictable", [0.95, 0.9, 0.9])
    set_rates(policy, "chatty", [0.2, 0.2, 0.2])
    chosen = policy.choose({"predictable": 3, "chatty": 3}, batch_size=2)
    assert chosen["predictable"] > 0 and chosen["chatty"] == 0, chosen


def test_a_late_position_that_fails_caps_the_draft_length():
    policy = make_policy(BF16_LIKE, max_draft_len=6, probe_interval=10**6)
    set_rates(policy, "r", [0.9, 0.9, 0.0, 0.9, 0.9, 0.9])
    assert choose_one(policy) == 2


def test_choice_never_exceeds_max_draft_len():
    policy = make_policy(ForwardCostModel([1, 64], [1.0, 1.0]), max_draft_len=3, rate=0.99)
    assert policy.choose({"r": 10}, 1) == {"r": 3}


def test_collapsed_acceptance_stops_drafting():
    for cost_model in (BF16_LIKE, FP32_LIKE):
        policy = make_policy(cost_model, probe_interval=10**6)
        assert choose_one(policy) > 0
        collapse(policy, "r")
        assert policy._requests["r"].rates[0] < 0.01
        assert choose_one(policy) == 0


def test_probe_with_one_draft_after_probe_interval_steps_at_zero():
    policy = make_policy(FP32_LIKE, probe_interval=5)
    collapse(policy, "r")
    choices = [choose_one(policy) for _ in range(15)]
    assert choices == [0, 0, 0, 0, 1] * 3


def test_a_request_without_slots_is_not_probed():
    policy = make_policy(FP32_LIKE, probe_interval=2)
    collapse(policy, "r")
    assert [policy.choose({"r": 0}, 1)["r"] for _ in range(6)] == [0] * 6


def test_successful_probes_bring_the_drafts_back():
    policy = make_policy(FP32_LIKE, probe_interval=3)
    collapse(policy, "r")
    chosen = []
    for _ in range(40):
        k = choose_one(policy)
        chosen.append(k)
        policy.observe("r", num_drafts=k, num_accepted=k)  # everything proposed is accepted
    assert chosen[:2] == [0, 0] and chosen[2] == 1
    assert chosen[-1] >= 2, chosen


# ---- the acceptance estimates ------------------------------------------------------------------------------


def test_observe_moves_each_tried_position_towards_what_happened_to_it():
    policy = make_policy(rate=0.6, decay=0.7, max_draft_len=4)
    policy.observe("r", num_drafts=4, num_accepted=4)  # all accepted
    assert policy._requests["r"].rates == pytest.approx([0.72] * 4)
    policy.observe("r", num_drafts=4, num_accepted=2)  # 1, 2 accepted, 3 rejected, 4 not tried
    assert policy._requests["r"].rates == pytest.approx([0.804, 0.804, 0.504, 0.72])
    policy.observe("r", num_drafts=3, num_accepted=0)  # 1 rejected
    assert policy._requests["r"].rates == pytest.approx([0.5628, 0.804, 0.504, 0.72])


def test_observe_without_drafts_changes_nothing():
    policy = make_policy(rate=0.6)
    policy.observe("r", num_drafts=0, num_accepted=0)
    assert "r" not in policy._requests
    choose_one(policy)
    policy.observe("r", num_drafts=0, num_accepted=0)
    assert policy._requests["r"].rates == pytest.approx([0.6] * 8)


def test_expected_tokens_multiply_the_rates_along_the_chain():
    policy = make_policy(max_draft_len=3)
    set_rates(policy, "r", [0.5, 0.5, 1.0])
    assert [policy.expected_tokens("r", k) for k in range(4)] == pytest.approx([1.0, 1.5, 1.75, 2.0])


def test_requests_have_separate_estimates_and_forget_resets_one():
    policy = make_policy(FP32_LIKE, probe_interval=10**6)
    collapse(policy, "bad")
    assert choose_one(policy, "bad") == 0
    assert choose_one(policy, "good") > 0
    policy.forget("bad")
    assert choose_one(policy, "bad") == choose_one(policy, "good")
    policy.forget("never-seen")  # no error


# ---- measuring and caching the cost curve -------------------------------------------------------------------


class FakeForward:
    """A forward over n tokens that takes ``base + per_token * n`` seconds on a fake clock."""

    def __init__(self, base: float = 0.05, per_token: float = 0.001) -> None:
        self.clock = 0.0
        self.base, self.per_token = base, per_token
        self.calls: list[int] = []

    def perf_counter(self) -> float:
        return self.clock

    def __call__(self, n: int) -> None:
        self.calls.append(n)
        self.clock += self.base + self.per_token * n


@pytest.fixture
def fake_forward(monkeypatch) -> FakeForward:
    fake = FakeForward()
    monkeypatch.setattr(measurement_cache, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


def test_measure_keeps_one_timing_per_size(fake_forward):
    model = measure_forward_cost(fake_forward, sizes=(1, 8, 32), repeats=3)
    assert model.num_tokens == [1, 8, 32]
    assert model.seconds == pytest.approx([0.051, 0.058, 0.082])
    assert fake_forward.calls == [1] * 4 + [8] * 4 + [32] * 4  # a warm-up, then the repeats


def test_measure_times_the_decode_batches_too(fake_forward):
    def decode_batch(b):  # b sequences: a fixed cost per sequence on the fake clock
        fake_forward.calls.append(("batch", b))
        fake_forward.clock += 0.05 + 0.01 * b

    model = measure_forward_cost(fake_forward, sizes=(1, 8), decode_batch=decode_batch, batch_sizes=(1, 4))
    assert model.batch_sizes == [1, 4] and model.batch_seconds == pytest.approx([0.06, 0.09])
    assert fake_forward.calls[-8:] == [("batch", 1)] * 4 + [("batch", 4)] * 4


def test_cached_measures_once_writes_json_then_reuses_it(tmp_path, fake_forward, caplog):
    with caplog.at_level(logging.INFO, logger="specexec"):
        first = stored_forward_cost("tiny|float64", fake_forward, tmp_path)
    assert fake_forward.calls, "nothing measured"
    assert any("measuring" in r.getMessage() for r in caplog.records)
    (path,) = tmp_path.glob("forward-cost-*.json")
    data = json.loads(path.read_text())
    assert data["key"] == "tiny|float64"
    assert data["num_tokens"] == list(MEASURED_SIZES)
    assert data["seconds"] == pytest.approx([0.05 + 0.001 * n for n in MEASURED_SIZES])

    fake_forward.calls.clear()
    second = stored_forward_cost("tiny|float64", fake_forward, tmp_path)
    assert fake_forward.calls == [1] * 4, "only the check of the smallest size: a warm-up, then 3 timed"
    assert second == first
    assert second.cost(3) == pytest.approx(first.cost(3))
    assert json.loads(path.read_text()) == data


def write_curve(cache_dir, key: str, seconds: list[float]) -> None:
    stored_forward_cost(key, FakeForward(), cache_dir)  # (a real clock: only the file's name matters)
    (path,) = cache_dir.glob("forward-cost-*.json")
    noise = {"spread": 1.0, "others_share": 0.0}  # measured on a quiet machine, as far as it could tell
    path.write_text(json.dumps({"key": key, "num_tokens": [1, 8], "seconds": seconds, NOISE_FIELD: noise}))


def test_a_cached_curve_measured_on_a_busier_machine_is_measured_again(tmp_path, fake_forward, caplog):
    write_curve(tmp_path, "k", [0.051 * 2, 0.2])  # twice a one-token forward now (0.051 s)
    with caplog.at_level(logging.INFO, logger="specexec"):
        model = stored_forward_cost("k", fake_forward, tmp_path)
    assert model.num_tokens == list(MEASURED_SIZES)
    assert model.seconds[0] == pytest.approx(0.051)
    assert any("measuring again" in r.getMessage() for r in caplog.records)
    (path,) = tmp_path.glob("forward-cost-*.json")
    assert json.loads(path.read_text())["seconds"] == pytest.approx(model.seconds)


@pytest.mark.parametrize("then", [0.051 * 1.4, 0.051, 0.051 / 3], ids=["a-bit-slower", "same", "busier-now"])
def test_a_cached_curve_within_reach_of_a_forward_now_is_kept(tmp_path, fake_forward, then):
    write_curve(tmp_path, "k", [then, 0.2])
    model = stored_forward_cost("k", fake_forward, tmp_path)
    assert model == ForwardCostModel([1, 8], [then, 0.2])
    assert fake_forward.calls == [1] * 4


@pytest.mark.parametrize("curve", [{"num_tokens": [], "seconds": []}, {"num_tokens": ["x"], "seconds": [1]}])
def test_a_cached_file_that_is_not_a_curve_is_measured_again(tmp_path, fake_forward, curve):
    stored_forward_cost("k", FakeForward(), tmp_path)
    (path,) = tmp_path.glob("forward-cost-*.json")
    path.write_text(json.dumps({"key": "k", **curve}))
    model = stored_forward_cost("k", fake_forward, tmp_path)
    assert model.num_tokens == list(MEASURED_SIZES)


def test_cached_measures_again_for_another_key(tmp_path, fake_forward):
    stored_forward_cost("model-a", fake_forward, tmp_path)
    num_calls = len(fake_forward.calls)
    stored_forward_cost("model-b", fake_forward, tmp_path)
    assert len(fake_forward.calls) == 2 * num_calls
    assert len(list(tmp_path.glob("forward-cost-*.json"))) == 2


@pytest.mark.parametrize("content", ["", "{not json", '{"num_tokens": [1, 2]}'])
def test_cached_remeasures_over_an_unreadable_file(tmp_path, fake_forward, content):
    stored_forward_cost("k", fake_forward, tmp_path)
    (path,) = tmp_path.glob("forward-cost-*.json")
    path.write_text(content)
    model = stored_forward_cost("k", fake_forward, tmp_path)
    assert model.num_tokens == list(MEASURED_SIZES)
    assert json.loads(path.read_text())["num_tokens"] == list(MEASURED_SIZES)


def test_cached_still_returns_the_measurement_when_the_cache_is_not_writable(tmp_path, fake_forward, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    with caplog.at_level(logging.WARNING, logger="specexec"):
        model = stored_forward_cost("k", fake_forward, blocker / "cache")
    assert model.num_tokens == list(MEASURED_SIZES)
    assert any("could not store" in r.getMessage() for r in caplog.records)


def test_cache_key_names_model_size_dtype_and_threads():
    _, model = make_tiny_model("llama")
    key = cost_cache_key(model)
    assert "torch.float64" in key and "cpu" in key and "threads=" in key
    assert describe_cpu() in key, "a curve measured on another CPU is not this one's"
    assert str(sum(p.numel() for p in model.parameters())) in key
    _, other = make_tiny_model("llama", num_hidden_layers=2)
    assert cost_cache_key(other) != key


def test_cache_key_tells_packed_layers_on_row_bands_from_packed_everywhere():
    _, model = make_tiny_model("llama", dtype=torch.float32)
    keys = [cost_cache_key(model)]
    for bands in (None, RowBands((1, 4), (False, True)), RowBands((1, 8), (False, True))):
        unpack_linears(model)
        pack_linears(model, bands)
        keys.append(cost_cache_key(model))
    assert len(set(keys)) == 4, keys


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECEXEC_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("SPECEXEC_CACHE_DIR")
    assert default_cache_dir().name == "specexec"


# ---- the executor's policies -----------------------------------------------------------------------------


def make_policy_executor(policy: str, cache_dir, **overrides) -> Executor:
    _, model = make_tiny_model("llama")
    settings = dict(
        num_kv_blocks=128,
        block_size=4,
        max_num_tokens=128,
        max_batch_size=8,
        dtype="float64",
        device="cpu",
        cache_dir=str(cache_dir),
        speculative_config={"decoding_type": "NGram", "max_draft_len": 4, "draft_len_policy": policy},
    )
    settings.update(overrides)
    return Executor(model, ExecutorConfig(**settings))


def test_acceptance_policy_uses_the_linear_cost_guess(tmp_path):
    executor = make_policy_executor("acceptance", tmp_path)
    assert executor.speculation.policy.cost_model == ForwardCostModel.linear()
    assert executor.speculation.policy.max_draft_len == 4
    measured = [p.name for p in tmp_path.iterdir() if p.name.startswith("forward-cost")]
    assert not measured, "the acceptance policy must not measure the forward cost"


def test_fixed_policy_has_no_policy(tmp_path):
    assert make_policy_executor("fixed", tmp_path).speculation.policy is None


def test_confidence_policy_runs_as_auto_for_a_drafter_without_confidences(tmp_path):
    executor = make_policy_executor("confidence", tmp_path)  # NGram reports no confidence
    assert executor.speculation.drafter.confidence_stop is None
    policy = executor.speculation.policy
    assert policy is not None and policy.cost_model.num_tokens == list(MEASURED_SIZES), "measured, as auto"


def test_auto_policy_measures_once_and_reuses_the_cache(tmp_path, monkeypatch):
    first = make_policy_executor("auto", tmp_path)
    (path,) = tmp_path.glob("forward-cost-*.json")
    measured = first.speculation.policy.cost_model
    assert measured.num_tokens == list(MEASURED_SIZES) and all(s > 0 for s in measured.seconds)
    assert first.block_manager.num_free_blocks == first.block_manager.num_blocks, "scratch pages leaked"

    def no_measuring(*args, **kwargs):
        raise AssertionError("the second executor measured again")

    monkeypatch.setattr(forward_cost, "measure_forward_cost", no_measuring)
    # (the check of a cached curve against a forward now is tested on a fake clock above: a tiny model's
    # sub-millisecond forwards are too noisy for it here)
    monkeypatch.setattr(forward_cost, "STALE_FACTOR", float("inf"))
    assert measured.batch_sizes == [1, 2, 4, 8] and all(s > 0 for s in measured.batch_seconds)
    second = make_policy_executor("auto", tmp_path)
    assert second.speculation.policy.cost_model == measured
    assert (
        json.loads(path.read_text())["key"] == cost_cache_key(second.model) + "|decode batches (1, 2, 4, 8)"
    )
    out = second.run([Request([9, 10, 11] * 6, SamplingParams(max_tokens=8, ignore_eos=True))])
    assert len(out[0].token_ids) == 8


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(dict(max_num_tokens=32), id="token-budget-below-64"),
        pytest.param(dict(num_kv_blocks=40), id="kv-pool-below-192-tokens"),
        # 16 decode sequences of 160 pool tokens: 10 tokens each would take 3 pages of 4, 48 of the 40
        pytest.param(dict(num_kv_blocks=40, max_batch_size=16), id="decode-batch-rounds-to-whole-pages"),
        pytest.param(dict(num_kv_blocks=12, max_batch_size=16), id="fewer-pages-than-the-batch"),
    ],
)
def test_auto_policy_starts_with_a_small_token_budget_or_kv_pool(tmp_path, overrides):
    """Measuring must fit the executor's own limits: a config that runs with the fixed policy must
    also start with "auto" (measuring fewer sizes, or a shorter context, where needed)."""
    make_policy_executor("fixed", tmp_path, **overrides)  # a valid configuration
    executor = make_policy_executor("auto", tmp_path, **overrides)
    assert executor.block_manager.num_free_blocks == executor.block_manager.num_blocks, "scratch pages leaked"
    out = executor.run([Request([9, 10, 11] * 6, SamplingParams(max_tokens=8, ignore_eos=True))])
    assert len(out[0].token_ids) == 8


def test_a_cached_curve_without_the_decode_batches_asked_for_is_measured_again(tmp_path, fake_forward):
    write_curve(tmp_path, "k", [0.051, 0.2])  # as cached before decode batches were measured

    def decode_batch(b):
        fake_forward.clock += 0.05 * b

    model = stored_forward_cost("k", fake_forward, tmp_path, decode_batch=decode_batch, batch_sizes=(1, 2))
    assert model.batch_sizes == [1, 2] and model.batch_seconds == pytest.approx([0.05, 0.1])
    again = stored_forward_cost("k", fake_forward, tmp_path, decode_batch=decode_batch, batch_sizes=(1, 2))
    assert again == model, "read back from the cache"


# ---- token trees: a level priced at `branching` rows, gaining where the chain's node is rejected --------


def test_a_tree_level_gains_what_its_other_nodes_catch():
    policy = make_policy(BF16_LIKE, max_draft_len=3, rate=0.5)
    chain, _ = policy.plan({"r": 3}, 1)
    tree_gains = policy._gains(policy._state("r"), 3, sibling_hit=0.4)
    chain_gains = policy._gains(policy._state("r"), 3)
    # level i: P(chain reaches i) + P(chain reaches i - 1, its node at i rejected, a sibling holds it)
    assert tree_gains == pytest.approx(
        [g + before * 0.5 * 0.4 for g, before in zip(chain_gains, [1.0, 0.5, 0.25])]
    )
    assert chain == {"r": 3}


def test_trees_are_planned_where_rows_are_cheap_and_chains_where_they_are_dear():
    def values(cost_model, batch):
        policy = make_policy(cost_model, max_draft_len=3, rate=0.5, probe_interval=10**6)
        drafts = {f"r{i}": 3 for i in range(batch)}
        _, chain = policy.plan(drafts, batch)
        _, tree = policy.plan(drafts, batch, rows_per_level=2, sibling_hit=0.4)
        return chain, tree

    chain, tree = values(BF16_LIKE, 1)  # a flat curve: 8 rows cost 1.11x one
    assert tree > chain
    chain, tree = values(FP32_LIKE, 1)  # a steep one (4 rows cost 2.1x one): every row counts
    assert chain > tree
