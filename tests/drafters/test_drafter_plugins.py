"""Finding drafters: the built-ins, ``UserProvided`` classes and third-party plugins loaded from the
``specexec`` entry-point group; and the errors a bad ``speculative_config`` gets at start-up.

Plugin loading is tested twice: with entry points faked through ``importlib.metadata`` (in process),
and with a real distribution (tests/data/specexec_echo_plugin) pip-installed into a temporary
directory and used from a fresh Python process.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pluggy
import pytest
import specexec
from factories import drafting_config, drafting_every_step, tiny_executor
from specexec.drafters.base import Drafter, DrafterContext, DraftProposal
from specexec.drafters.draft_target import DraftTargetDrafter
from specexec.drafters.ngram import NGramDrafter
from specexec.executor.engine.request import Request
from specexec.executor.engine.speculation.speculative_config import SpeculativeConfig
from specexec.executor.executor import Executor
from specexec.plugins import get_plugin_manager
from specexec.plugins.manager import DISABLE_AUTOLOAD_ENV
from specexec.sampling import SamplingParams
from tiny_models import make_tiny_model, make_tiny_tokenizer

TESTS_DIR = Path(__file__).resolve().parents[1]
ECHO_PLUGIN_SRC = TESTS_DIR / "data" / "specexec_echo_plugin"
BUILTIN_NAMES = ("NGram", "DraftTarget", "UserProvided")
PROMPT = [9, 10, 11] * 6


def drafting_executor(speculative_config=None, arch: str = "llama", **kwargs) -> Executor:
    """A tiny ``arch`` executor whose drafter (named in ``speculative_config``) drafts every step."""
    return tiny_executor(arch, speculative_config=drafting_every_step(speculative_config), **kwargs)


def greedy_tokens(executor: Executor, max_tokens: int = 12) -> list[int]:
    (out,) = executor.run([Request(PROMPT, SamplingParams(max_tokens=max_tokens, ignore_eos=True))])
    return out.token_ids


@pytest.fixture
def no_plugins(monkeypatch):
    """Only the built-ins, whatever is installed in this environment."""
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")


# ---- drafters defined here -------------------------------------------------------------------------------


class RepeatLastDrafter(Drafter):
    """Proposes the last token ``repeat`` times (at most the reserved slots)."""

    def __init__(self, max_draft_len: int, repeat: int = 1) -> None:
        super().__init__(max_draft_len)
        self.repeat = repeat

    def propose(self, request, num_slots, resources) -> DraftProposal:
        return DraftProposal([request.token_ids[-1]] * min(self.repeat, num_slots))


class NotADrafter:
    def __init__(self, max_draft_len: int) -> None:
        self.max_draft_len = max_draft_len


def make_fake_plugin_module(name: str, factories: dict) -> types.ModuleType:
    module = types.ModuleType(name)

    @specexec.hookimpl
    def specexec_drafter_factories():
        return factories

    module.specexec_drafter_factories = specexec_drafter_factories
    return module


class FakeDistribution:
    """What pluggy reads from an importlib.metadata distribution."""

    def __init__(self, entry_points) -> None:
        self.entry_points = entry_points
        self.metadata = {"name": "fake-specexec-plugin"}
        self.version = "1.0"


@pytest.fixture
def fake_entry_point(monkeypatch):
    """Install a plugin module under the entry-point name ``fakeplug`` (group ``specexec``), faked
    through importlib.metadata.distributions; returns a function taking the factories to provide."""
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)

    def install(factories: dict, module_name: str = "fake_specexec_plugin") -> None:
        monkeypatch.setitem(sys.modules, module_name, make_fake_plugin_module(module_name, factories))
        entry_point = importlib.metadata.EntryPoint(name="fakeplug", value=module_name, group="specexec")
        other_group = importlib.metadata.EntryPoint(name="other", value="json", group="console_scripts")
        monkeypatch.setattr(
            importlib.metadata, "distributions", lambda: [FakeDistribution([other_group, entry_point])]
        )

    return install


def make_repeat_factory(options, context):
    assert isinstance(context, DrafterContext)
    assert context.vocab_size == 256 and context.executor_config.block_size == 4
    return RepeatLastDrafter(context.max_draft_len, **options)


# ---- decoding_type ---------------------------------------------------------------------------------------


def test_unknown_decoding_type_lists_the_known_drafters_and_the_plugins(no_plugins):
    with pytest.raises(ValueError, match="decoding_type") as info:
        drafting_executor({"decoding_type": "Hydra", "max_draft_len": 3})
    message = str(info.value)
    assert "'Hydra'" in message
    for name in BUILTIN_NAMES:
        assert name in message
    assert "installed plugins: none" in message


@pytest.mark.parametrize(
    "name, expected",
    [
        ("ngram", NGramDrafter),
        ("NGRAM", NGramDrafter),
        ("drafttarget", DraftTargetDrafter),
        ("draft_target", None),
    ],
)
def test_decoding_type_is_case_insensitive_but_not_fuzzy(no_plugins, name, expected):
    spec = {"decoding_type": name, "max_draft_len": 2}
    if expected is None:
        with pytest.raises(ValueError, match="unknown speculative_config.decoding_type"):
            drafting_executor(spec)
    else:
        assert isinstance(drafting_executor(spec).speculation.drafter, expected)


@pytest.mark.parametrize("decoding_type", [None, "", 3])
def test_decoding_type_must_be_a_name(decoding_type):
    with pytest.raises(ValueError, match="decoding_type"):
        SpeculativeConfig(decoding_type=decoding_type)
    with pytest.raises(ValueError, match="decoding_type"):
        drafting_config(speculative_config={"max_draft_len": 3})


# ---- max_draft_len and the other common keys ----------------------------------------------------------------


@pytest.mark.parametrize("max_draft_len", [0, 33, -1, True, 2.0, "3", None])
def test_out_of_range_max_draft_len_names_the_field(max_draft_len):
    with pytest.raises(ValueError, match="max_draft_len") as info:
        drafting_config(speculative_config={"decoding_type": "NGram", "max_draft_len": max_draft_len})
    assert "1..32" in str(info.value)
    assert repr(max_draft_len) in str(info.value)


@pytest.mark.parametrize("max_draft_len", [1, 32])
def test_max_draft_len_bounds_are_inclusive(no_plugins, max_draft_len):
    executor = drafting_executor({"decoding_type": "NGram", "max_draft_len": max_draft_len})
    assert executor.speculation.max_draft_len == max_draft_len


@pytest.mark.parametrize("max_draft_len", [0, 33])
def test_drafter_base_class_checks_max_draft_len_too(max_draft_len):
    with pytest.raises(ValueError, match="max_draft_len"):
        RepeatLastDrafter(max_draft_len)


@pytest.mark.parametrize(
    "key, value, field",
    [
        ("draft_len_schedule", {1: 4}, "draft_len_schedule"),  # above max_draft_len 3
        ("draft_len_schedule", {0: 1}, "draft_len_schedule"),
        ("draft_len_schedule", [1, 2], "draft_len_schedule"),
        ("draft_len_policy", "greedy", "draft_len_policy"),
    ],
)
def test_bad_schedule_or_policy_names_the_field(key, value, field):
    with pytest.raises(ValueError, match=field):
        drafting_config(speculative_config={"decoding_type": "NGram", "max_draft_len": 3, key: value})


# ---- drafter options --------------------------------------------------------------------------------------


def test_unknown_ngram_option_lists_the_allowed_ones(no_plugins):
    with pytest.raises(ValueError, match="unknown NGram option") as info:
        drafting_executor({"decoding_type": "NGram", "max_draft_len": 3, "max_ngram": 2, "pool": "shared"})
    message = str(info.value)
    assert "'max_ngram'" in message and "'pool'" in message
    for allowed in ("max_matching_ngram_size", "is_public_pool", "is_keep_all", "is_use_oldest"):
        assert allowed in message
    assert "max_draft_len" not in message.partition("allowed:")[2], "max_draft_len is not an NGram option"


def test_ngram_options_reach_the_drafter_and_bad_values_are_refused(no_plugins):
    spec = {
        "decoding_type": "NGram",
        "max_draft_len": 3,
        "max_matching_ngram_size": 2,
        "is_public_pool": False,
    }
    drafter = drafting_executor(spec).speculation.drafter
    assert drafter.options.max_matching_ngram_size == 2 and drafter.options.is_public_pool is False
    with pytest.raises(ValueError, match="is_public_pool"):
        drafting_executor({"decoding_type": "NGram", "max_draft_len": 3, "is_public_pool": "yes"})


def test_unknown_draft_target_option_lists_the_allowed_ones(no_plugins):
    with pytest.raises(ValueError, match="unknown DraftTarget option") as info:
        drafting_executor({"decoding_type": "DraftTarget", "max_draft_len": 3, "temperature": 0.5})
    message = str(info.value)
    assert "'temperature'" in message
    for allowed in ("speculative_model", "speculative_model_dir", "sample_drafts", "kv_cache_memory_gb"):
        assert allowed in message


def test_options_may_also_be_given_as_an_options_mapping(no_plugins):
    spec = {"decoding_type": "NGram", "max_draft_len": 3, "options": {"is_use_oldest": False}}
    assert drafting_executor(spec).speculation.drafter.options.is_use_oldest is False


# ---- DraftTarget draft models ------------------------------------------------------------------------------


def save_draft_model(path: Path, vocab_size: int = 256, tokenizer=None) -> Path:
    _, model = make_tiny_model("llama", seed=3, num_hidden_layers=2, vocab_size=vocab_size)
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def test_draft_model_with_another_vocabulary_is_refused_at_start_up(no_plugins, tmp_path):
    path = save_draft_model(tmp_path / "draft", vocab_size=128)
    with pytest.raises(ValueError, match="vocabulary") as info:
        drafting_executor(
            {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model": str(path)}
        )
    assert "128" in str(info.value) and "256" in str(info.value)


def test_draft_model_instance_with_another_vocabulary_is_refused():
    _, draft = make_tiny_model("llama", vocab_size=128)
    with pytest.raises(ValueError, match="vocabulary"):
        DraftTargetDrafter(draft, 3, 256, num_kv_blocks=8)


def test_draft_tokenizer_with_other_ids_is_refused_at_start_up(no_plugins, tmp_path):
    """Same vocabulary size, but a tokenizer that maps words to other ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [f"x{i}" for i in range(255)] + ["<unk>"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    other = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    path = save_draft_model(tmp_path / "draft", tokenizer=other)
    spec = {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model_dir": str(path)}
    with pytest.raises(ValueError, match="tokenizers map tokens to different ids"):
        drafting_executor(spec, tokenizer=make_tiny_tokenizer())


def test_draft_model_from_a_directory_drafts_without_changing_the_output(no_plugins, tmp_path):
    path = save_draft_model(tmp_path / "draft", tokenizer=make_tiny_tokenizer())
    spec = {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model": str(path)}
    executor = drafting_executor(spec, tokenizer=make_tiny_tokenizer())
    assert isinstance(executor.speculation.drafter, DraftTargetDrafter)
    assert greedy_tokens(executor) == greedy_tokens(drafting_executor())
    assert executor.speculation.stats.num_draft_tokens > 0


# ---- UserProvided --------------------------------------------------------------------------------------------


def test_user_provided_drafter_class_is_imported_and_built_with_its_options(no_plugins):
    spec = {
        "decoding_type": "UserProvided",
        "max_draft_len": 3,
        "drafter": f"{__name__}:RepeatLastDrafter",
        "drafter_options": {"repeat": 2},
    }
    executor = drafting_executor(spec, arch="qwen3")
    drafter = executor.speculation.drafter
    assert type(drafter).__name__ == "RepeatLastDrafter" and drafter.repeat == 2
    assert drafter.max_draft_len == 3
    assert greedy_tokens(executor) == greedy_tokens(drafting_executor(arch="qwen3"))
    stats = executor.speculation.stats
    assert 0 < stats.num_draft_tokens <= 2 * stats.num_draft_steps


@pytest.mark.parametrize(
    "options, match",
    [
        ({}, "package.module:ClassName"),
        ({"drafter": "RepeatLastDrafter"}, "package.module:ClassName"),
        ({"drafter": "no_such_module_xyz:Drafter"}, "cannot import drafter"),
        ({"drafter": f"{__name__}:NoSuchClass"}, "cannot import drafter"),
        ({"drafter": f"{__name__}:NotADrafter"}, "not a subclass"),
        ({"drafter": f"{__name__}:RepeatLastDrafter", "repeat": 2}, "unknown UserProvided option"),
        # (the class it resolves is kept on the options, not a key a config may set)
        (
            {"drafter": f"{__name__}:RepeatLastDrafter", "drafter_class": 2},
            "allowed: drafter, drafter_options$",
        ),
    ],
)
def test_user_provided_errors(no_plugins, options, match):
    with pytest.raises(ValueError, match=match):
        drafting_executor({"decoding_type": "UserProvided", "max_draft_len": 3, **options})


def test_a_drafter_instance_and_a_non_drafter_instance():
    executor = drafting_executor(drafter=RepeatLastDrafter(2))
    assert executor.speculation.drafter.max_draft_len == 2
    assert greedy_tokens(executor) == greedy_tokens(drafting_executor())
    with pytest.raises(ValueError, match="Drafter"):
        drafting_executor(drafter=NotADrafter(2))


# ---- the plugin machinery -------------------------------------------------------------------------------------


def test_hookimpl_is_exported_from_the_package():
    assert "hookimpl" in specexec.__all__
    assert isinstance(specexec.hookimpl, pluggy.HookimplMarker)
    assert specexec.hookimpl.project_name == "specexec"
    from specexec import hookimpl
    from specexec.plugins import hookimpl as plugins_hookimpl

    assert hookimpl is plugins_hookimpl


def test_plugin_manager_has_the_builtin_drafters(no_plugins):
    pm = get_plugin_manager()
    names = {name for name, _ in pm.list_name_plugin()}
    assert "specexec.drafters.builtin" in names
    factories = {}
    for result in pm.hook.specexec_drafter_factories():
        factories.update(result)
    assert set(BUILTIN_NAMES) <= set(factories)


def test_entry_point_plugin_provides_a_drafter(fake_entry_point):
    fake_entry_point({"RepeatLast": make_repeat_factory})
    pm = get_plugin_manager()
    assert pm.get_plugin("fakeplug") is sys.modules["fake_specexec_plugin"]
    spec = {"decoding_type": "RepeatLast", "max_draft_len": 3, "repeat": 3}
    executor = drafting_executor(spec, arch="qwen3")
    assert isinstance(executor.speculation.drafter, RepeatLastDrafter)
    assert executor.speculation.drafter.repeat == 3
    assert greedy_tokens(executor) == greedy_tokens(drafting_executor(arch="qwen3"))
    assert executor.speculation.stats.num_draft_tokens > 0


def test_entry_point_plugin_is_named_in_the_unknown_decoding_type_error(fake_entry_point):
    fake_entry_point({"RepeatLast": make_repeat_factory})
    with pytest.raises(ValueError) as info:
        drafting_executor({"decoding_type": "Hydra", "max_draft_len": 3})
    message = str(info.value)
    assert "RepeatLast" in message.partition("known:")[2]
    assert "installed plugins: fakeplug" in message


def test_disable_autoload_skips_entry_points(fake_entry_point, monkeypatch):
    fake_entry_point({"RepeatLast": make_repeat_factory})
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    assert get_plugin_manager().get_plugin("fakeplug") is None
    with pytest.raises(ValueError, match="installed plugins: none") as info:
        drafting_executor({"decoding_type": "RepeatLast", "max_draft_len": 3})
    assert "RepeatLast" not in str(info.value).partition("known:")[2]


def test_plugin_factory_returning_a_non_drafter_is_refused(fake_entry_point):
    fake_entry_point({"Broken": lambda options, context: NotADrafter(context.max_draft_len)})
    with pytest.raises(ValueError, match="not a Drafter"):
        drafting_executor({"decoding_type": "Broken", "max_draft_len": 3})


def test_plugin_cannot_shadow_a_builtin_silently(fake_entry_point):
    """A plugin offering a built-in's name must not take over the built-in without a trace: either the
    built-in wins, or the executor refuses the ambiguity."""
    fake_entry_point({"NGram": make_repeat_factory})
    try:
        executor = drafting_executor({"decoding_type": "NGram", "max_draft_len": 3})
    except ValueError as exc:
        assert "NGram" in str(exc)
    else:
        assert isinstance(executor.speculation.drafter, NGramDrafter)


# ---- a real plugin distribution ---------------------------------------------------------------------------------

ECHO_SCRIPT = textwrap.dedent(
    """
    import json, os

    import torch

    torch.set_num_threads(1)
    from specexec.executor.config import ExecutorConfig
    from specexec.executor.executor import Executor
    from specexec.executor.engine.request import Request
    from specexec.plugins import get_plugin_manager
    from specexec.sampling import SamplingParams
    from tiny_models import make_tiny_model

    PROMPTS = [[9, 10, 11] * 6, [5, 6, 7, 8] * 4, [42] * 8]

    def run(speculative_config=None):
        _, model = make_tiny_model("qwen3")
        config = ExecutorConfig(
            num_kv_blocks=64, block_size=4, max_num_tokens=64, dtype="float64", device="cpu",
            speculative_config=speculative_config,
        )
        executor = Executor(model, config)
        outs = executor.run(
            [Request(p, SamplingParams(max_tokens=16, ignore_eos=True)) for p in PROMPTS]
        )
        return executor, outs

    result = {"plugins": sorted(n for n, _ in get_plugin_manager().list_name_plugin())}
    executor, outs = run({"decoding_type": "Echo", "max_draft_len": 2})
    _, plain = run()
    result["drafter"] = type(executor.speculation.drafter).__name__
    result["proposed"] = sum(o.metrics.num_draft_tokens for o in outs)
    result["accepted"] = sum(o.metrics.num_accepted_tokens for o in outs)
    result["identical"] = [o.token_ids for o in outs] == [o.token_ids for o in plain]
    try:
        run({"decoding_type": "Hydra", "max_draft_len": 2})
    except ValueError as exc:
        result["unknown_error"] = str(exc)
    os.environ["SPECEXEC_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        run({"decoding_type": "Echo", "max_draft_len": 2})
    except ValueError as exc:
        result["disabled_error"] = str(exc)
    print(json.dumps(result))
    """
)


@pytest.fixture(scope="module")
def echo_plugin_site(tmp_path_factory) -> Path:
    """tests/data/specexec_echo_plugin pip-installed (offline, no deps) into a fresh directory."""
    root = tmp_path_factory.mktemp("echo-plugin")
    src = root / "src"
    shutil.copytree(ECHO_PLUGIN_SRC, src)  # the build writes build/ and egg-info next to the sources
    site = root / "site"
    cmd = [
        sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
        "--disable-pip-version-check", "--root-user-action=ignore", "--quiet", "--target", str(site), str(src),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / "specexec_echo_plugin.py").is_file()
    return site


def test_installed_plugin_distribution_declares_its_entry_point(echo_plugin_site):
    (dist_info,) = echo_plugin_site.glob("specexec_echo_plugin-*.dist-info")
    entry_points = (dist_info / "entry_points.txt").read_text()
    assert "[specexec]" in entry_points and "echo = specexec_echo_plugin" in entry_points


def test_real_plugin_package_drafts_through_its_entry_point(echo_plugin_site):
    env = {k: v for k, v in os.environ.items() if k != DISABLE_AUTOLOAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(echo_plugin_site), str(TESTS_DIR)])
    proc = subprocess.run(
        [sys.executable, "-c", ECHO_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=TESTS_DIR,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "echo" in result["plugins"]
    assert result["drafter"] == "EchoDrafter"
    assert result["identical"], "the Echo drafter changed the greedy output"
    assert result["proposed"] > 0
    assert 0 < result["accepted"] < result["proposed"]
    unknown = result["unknown_error"]
    assert "'Hydra'" in unknown
    assert "Echo" in unknown.partition("known:")[2]
    assert "installed plugins: echo" in unknown
    assert "installed plugins: none" in result["disabled_error"]
    assert "Echo" not in result["disabled_error"].partition("known:")[2]
