"""The first things a new user types: ``--version``, ``python -m specexec``, printing a finish reason."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
from specexec import FinishReason
from specexec.cli import main


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"specexec {importlib.metadata.version('specexec')}"


def test_python_dash_m_runs_the_same_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "specexec", "--version"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("specexec ")


@pytest.mark.parametrize("reason", list(FinishReason))
def test_a_finish_reason_prints_as_its_value(reason):
    assert str(reason) == reason.value == f"{reason}"
    assert reason == reason.value  # still a str enum: comparisons with the plain string hold


def test_drafters_lists_built_in_and_plugin_drafters_with_their_options(monkeypatch, capsys):
    import types

    from specexec.plugins import hookimpl, manager

    plugin = types.ModuleType("my_drafters")

    def factory(options, context):
        raise AssertionError("listing builds no drafter")

    plugin.specexec_drafter_factories = hookimpl(lambda: {"MyDrafter": factory})
    real = manager.get_plugin_manager

    def with_plugin():
        pm = real()
        pm.register(plugin, name="my_drafters")
        return pm

    monkeypatch.setattr(manager, "get_plugin_manager", with_plugin)
    listing = {d.names: d for d in manager.list_drafters(with_plugin())}
    assert listing[("Eagle", "Eagle3")].source == "built-in"
    assert ("quantization", "auto") in listing[("DraftTarget",)].options
    assert listing[("MyDrafter",)].source == "plugin my_drafters" and listing[("MyDrafter",)].options == ()
    assert main(["drafters"]) == 0
    out = capsys.readouterr().out
    for name in (
        "NGram  (built-in)",
        "DraftTarget",
        "Eagle / Eagle3",
        "UserProvided",
        "MyDrafter  (plugin my_drafters)",
    ):
        assert name in out
    assert "max_matching_ngram_size: 3" in out


def test_run_help_names_every_built_in_drafter(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "NGram, Suffix, REST, DraftTarget, Eagle, UserProvided" in help_text
    assert "specexec drafters" in help_text


def test_progress_false_loads_a_model_without_progress_bars(tmp_path, capfd):
    from specexec import Executor, ExecutorConfig
    from tiny_models import save_tiny_model_dir

    path = save_tiny_model_dir(tmp_path / "tiny")
    capfd.readouterr()
    Executor(config=ExecutorConfig(model=str(path), dtype="float32", num_kv_blocks=8, progress=False))
    quiet = capfd.readouterr()
    assert "Loading weights" not in quiet.err + quiet.out
    Executor(config=ExecutorConfig(model=str(path), dtype="float32", num_kv_blocks=8))
    loud = capfd.readouterr()
    assert "Loading weights" in loud.err + loud.out, "the test must see the bar when it is on"


def test_a_cached_conversion_loads_quietly_and_the_cli_says_where_it_lies(tmp_path, capfd, monkeypatch):
    """The first load of a GGUF converts it (announced, with its bars); every later load is quiet even
    with progress on, and the CLI's loader line names the cached copy."""
    import logging

    import torch
    from gguf_files import write_gguf
    from specexec.cli import _show_loading
    from specexec.executor.model import model_loader
    from tiny_models import make_tiny_model, make_tiny_tokenizer

    fake = tmp_path / "tiny.gguf"  # a real header (the caches are keyed by it); its conversion is faked
    write_gguf(fake, "llama3")
    monkeypatch.setattr(
        model_loader,
        "_convert_gguf",
        lambda path: (make_tiny_model("llama", torch.float32)[1], make_tiny_tokenizer()),
    )
    loading = logging.getLogger("specexec.loading")
    saved = (list(loading.handlers), loading.level, loading.propagate)
    try:
        _show_loading()
        first = model_loader.load_model(fake, cache_dir=tmp_path / "cache", progress=True)
        assert "converted now" in first.source
        err = capfd.readouterr().err
        assert (
            f"[converting tiny.gguf to float32 once; the converted copy goes to {tmp_path / 'cache'}" in err
        )
        second = model_loader.load_model(fake, cache_dir=tmp_path / "cache", progress=True)
        assert "cached conversion at" in second.source
        quiet = capfd.readouterr()
        assert quiet.out == "" and quiet.err == "", quiet
    finally:
        loading.handlers[:], loading.level, loading.propagate = saved


def test_the_console_command_runs_a_prompt_to_the_end_and_exits_with_its_code(tmp_path):
    """``python -m specexec run`` (the console entry, which skips the interpreter's teardown): the whole
    answer and the metrics line are out, the loader's line names the model, the exit code is run's."""
    from tiny_models import save_tiny_model_dir

    path = save_tiny_model_dir(tmp_path / "tiny")
    command = [sys.executable, "-m", "specexec", "run", "--model", path, "--dtype", "float32"]
    done = subprocess.run(
        command + ["--prompt", "w1 w2 w3", "--max-tokens", "5"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) >= 1 and done.stdout.endswith("\n")
    assert f"[model: {path}]" in done.stderr
    assert "[cpu kernels: C++ (built at install for " in done.stderr, (
        "which CPU kernels run, and built for what"
    )
    assert "[finish=length prompt=" in done.stderr and "output=5" in done.stderr
    failed = subprocess.run(command + ["--prompt", "w1", "--max-tokens", "0"], capture_output=True, text=True)
    assert failed.returncode == 2 and "max_tokens" in failed.stderr
