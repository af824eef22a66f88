"""A start's measuring is bounded (executor/kernel_plan/measurement/budget.py): past its budget, or while
other work takes the CPUs, a choice with nothing stored takes its CPU level's static default
(executor/kernel_plan/static_defaults.py), stores nothing, and says so in one line; a quiet start or
`specexec tune` measures it then."""

from __future__ import annotations

import json
import logging
import time

import pytest
import torch
from factories import drafting_config
from specexec.executor.config import ExecutorConfig
from specexec.executor.executor import Executor
from specexec.executor.kernel_plan import static_defaults
from specexec.executor.kernel_plan.measurement import budget
from specexec.executor.kernel_plan.measurement.budget import measuring_budget, why_not_measure
from specexec.executor.kernel_plan.measurement.journal import measurement_notes, remeasuring
from specexec.executor.kernel_plan.measurement.store import STATIC_FIELD, cached_measurement
from specexec.executor.layers.cpu_kernels import installed_variant
from specexec.sampling import SamplingParams
from tiny_models import make_tiny_model


def measured_choice() -> dict:
    return {"choice": "measured"}


def test_a_spent_budget_takes_the_static_default_and_stores_nothing(tmp_path):
    default = {"choice": "static", STATIC_FIELD: "the static default for test"}
    since = len(measurement_notes())
    with measuring_budget(0.0):
        answer = cached_measurement(
            tmp_path, "kind", "key", measured_choice, "timing", ("choice",), default=default
        )
    assert answer["choice"] == "static"
    assert not list(tmp_path.glob("kind-*.json")), "a static default is never stored"
    (note,) = measurement_notes(since)
    assert note.how == "static default (the start's measuring budget is spent)"
    with measuring_budget(60.0):  # under budget: measured and stored
        assert cached_measurement(
            tmp_path, "kind", "key", measured_choice, "timing", ("choice",), default=default
        ) == {"choice": "measured"}
    (path,) = tmp_path.glob("kind-*.json")
    assert json.loads(path.read_text())["choice"] == "measured"
    with measuring_budget(0.0):  # what is stored wins over the default, budget or not
        assert (
            cached_measurement(
                tmp_path, "kind", "key", measured_choice, "timing", ("choice",), default=default
            )["choice"]
            == "measured"
        )


def test_busy_cpus_take_the_default_but_tune_and_a_kind_without_one_measure(tmp_path, monkeypatch):
    monkeypatch.setattr(budget, "machine_is_busy", lambda: True)
    default = {"choice": "static", STATIC_FIELD: "the static default for test"}
    assert why_not_measure() == "other work takes the CPUs"
    assert (
        cached_measurement(tmp_path, "kind", "a", measured_choice, "t", ("choice",), default=default)[
            "choice"
        ]
        == "static"
    )
    assert (
        cached_measurement(tmp_path, "kind", "b", measured_choice, "t", ("choice",))["choice"] == "measured"
    )
    with remeasuring():
        assert why_not_measure() is None
        assert (
            cached_measurement(tmp_path, "kind", "a", measured_choice, "t", ("choice",), default=default)[
                "choice"
            ]
            == "measured"
        )


def test_the_budget_runs_out_with_time():
    with measuring_budget(0.05):
        assert why_not_measure() is None or why_not_measure() == "other work takes the CPUs"
        time.sleep(0.06)
        assert why_not_measure() == "the start's measuring budget is spent"
    with measuring_budget(None):
        assert why_not_measure() != "the start's measuring budget is spent"


def test_a_static_default_is_looked_up_by_the_loaded_level_and_case(monkeypatch):
    variant = installed_variant()
    if variant is None:
        pytest.fail("this test needs an x86-64-v3 CPU or richer (every machine here is one)")
    case = static_defaults.case_name(dtype=torch.float32, cpp=True)
    assert case == "cpp=True|dtype=torch.float32"
    level = static_defaults.static_level()
    table = {
        level: {
            "source": "measured here",
            "kinds": {"attention-paths": {case: {"decode_single@256": "sdpa"}}},
        }
    }
    monkeypatch.setattr(static_defaults, "STATIC_DEFAULTS", table)
    answer = static_defaults.static_default("attention-paths", case)
    assert answer["decode_single@256"] == "sdpa" and level in answer[STATIC_FIELD]
    assert static_defaults.static_default("attention-paths", "dtype=torch.float64") is None
    assert static_defaults.static_default("dtype-choice", case) is None


def test_an_amx_level_without_an_entry_of_its_own_takes_its_avx512_levels(monkeypatch):
    monkeypatch.setattr(static_defaults, "static_level", lambda: "avx512_bf16+amx")
    entry = {"source": "measured on one", "kinds": {"dtype-choice": {"c": {"bf16_ratio": 0.5}}}}
    monkeypatch.setattr(static_defaults, "STATIC_DEFAULTS", {"avx512_bf16": entry})
    assert "for avx512_bf16 (" in static_defaults.static_default("dtype-choice", "c")[STATIC_FIELD]
    amx = {"source": "measured on an AMX one", "kinds": {"dtype-choice": {"c": {"bf16_ratio": 0.9}}}}
    monkeypatch.setattr(static_defaults, "STATIC_DEFAULTS", {"avx512_bf16": entry, "avx512_bf16+amx": amx})
    assert static_defaults.static_default("dtype-choice", "c")["bf16_ratio"] == 0.9


def test_the_level_has_amx_only_where_onednn_may_use_it(monkeypatch):
    monkeypatch.setattr(static_defaults, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16"}))
    variant = installed_variant()
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    expected = f"{variant.name}+amx" if variant.name.startswith("avx512") else variant.name
    assert static_defaults.static_level() == expected
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert static_defaults.static_level() == variant.name


def test_every_shipped_static_default_reads_as_its_kinds_measurement():
    """The table's answers must have the fields their kind's choice reads from a measurement."""
    needs = {
        "dtype-choice": ("bf16_ratio", "bf16_turns"),
        "attention-paths": ("decode_single@256", "verify_batched@2048"),
        "quantized-kernel": ("ratios",),
        "linear-backend": ("onednn_ratios",),
        "linear-backend-mkl": ("mkl_ratio",),
        "forward-cost": ("num_tokens", "seconds"),
    }
    assert static_defaults.STATIC_DEFAULTS, "no level has static defaults"
    for level, entry in static_defaults.STATIC_DEFAULTS.items():
        source, kinds = entry["source"], entry["kinds"]
        assert source and set(kinds) <= set(needs), level
        for kind, cases in kinds.items():
            for case, answer in cases.items():
                assert all(name in answer for name in needs[kind]), (level, kind, case)
        forward = kinds.get("forward-cost", {})
        for answer in forward.values():
            assert answer["seconds"][0] == pytest.approx(1.0), "curves are relative to one forward"


def test_a_start_past_its_budget_runs_on_static_defaults_and_says_so_once(tmp_path, monkeypatch, caplog):
    variant = installed_variant()
    _, model = make_tiny_model("llama", dtype=torch.float32)
    case = static_defaults.case_name(dtype=torch.float32, cpp=True)
    paths = {
        f"{name}@{context}": "sdpa"
        for name in ("decode_single", "decode_batched", "verify_single", "verify_batched")
        for context in (256, 2048)
    }
    table = {variant.name: {"source": "measured here", "kinds": {"attention-paths": {case: paths}}}}
    monkeypatch.setattr(static_defaults, "STATIC_DEFAULTS", table)
    monkeypatch.setattr(budget, "machine_is_busy", lambda: True)
    config = drafting_config(dtype="float32", cache_dir=str(tmp_path), speculative_config=None)
    with caplog.at_level(logging.WARNING, logger="specexec"), Executor(model, config) as executor:
        assert executor.setup.kernel_plan.attention_paths.short_context == ("sdpa",) * 4
        out = executor.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(out[0].token_ids) == 4
    lines = [r.getMessage() for r in caplog.records if "static defaults" in r.getMessage()]
    assert len(lines) == 1 and "attention-paths" in lines[0] and "other work takes the CPUs" in lines[0]
    assert not list(tmp_path.glob("attention-paths-*.json"))


def test_the_budget_key_is_checked():
    with pytest.raises(ValueError, match="measuring_budget_s"):
        ExecutorConfig(measuring_budget_s=0)
    assert ExecutorConfig(measuring_budget_s=None).measuring_budget_s is None
