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
