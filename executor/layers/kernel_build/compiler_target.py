"""What ``-march=native`` means to the C++ compiler that builds specexec's CPU kernels: the target
options the compiler driver expands it into for the compiler proper (gcc's ``-march=znver3 -mavx512f
... -mno-amx-tile``, clang's ``-target-cpu``/``-target-feature``), as its ``-###`` dry run prints
them, and its version line.

A build made with ``-march=native`` runs only where these are the same: two VMs that report one CPU
model name can differ in AVX512-FP16, VBMI, GFNI, AVX-VNNI or AMX, and a build for the richer one
dies with SIGILL on the other. So these options, not the CPU's name, key a build (`cpu_kernels.py`).
The dry run compiles nothing (about 10 ms) and is asked once per process.
"""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
from dataclasses import dataclass

#: clang's target options, each followed by its value, in the driver's line for the compiler proper
#: (gcc's target options are its ``-m...`` words and ``--param`` pairs); the rest of that line names
#: paths and the working folder, which change from run to run
CLANG_TARGET_OPTIONS = ("-triple", "-target-cpu", "-target-feature", "-target-abi")


@dataclass(frozen=True, slots=True)
class CompilerTarget:
    """One compiler's answer for one set of flags."""

    compiler: str  #: the command torch's cpp_extension builds with (``$CXX``, else ``c++``)
    version: str  #: the compiler's version line ("gcc version 12.2.0 (Debian 12.2.0-14)")
    options: tuple[str, ...]  #: the target options, in the compiler's order; empty where it said none

    @property
    def cpu(self) -> str:
        """The CPU the build targets ("znver3", "sapphirerapids"); "" where the compiler did not say."""
        for i, option in enumerate(self.options):
            if option.startswith("-march="):
                return option.removeprefix("-march=")
            if option == "-target-cpu" and i + 1 < len(self.options):
                return self.options[i + 1]
        return ""


def compiler_command() -> str:
    """The C++ compiler torch's cpp_extension runs (its own rule: ``$CXX``, else ``c++``)."""
    return os.environ.get("CXX", "c++")


@functools.cache
def compiler_target(compiler: str, flags: tuple[str, ...]) -> CompilerTarget:
    """What ``compiler`` targets with ``flags``; a compiler that is missing or does not answer gives
    empty fields (its build then fails on its own, and is reported there)."""
    try:
        done = subprocess.run(
            [*shlex.split(compiler), *flags, "-###", "-E", "-x", "c++", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, ValueError, subprocess.SubprocessError):
        return CompilerTarget(compiler, "", ())
    lines = (done.stderr + done.stdout).splitlines()
    version = next((line.strip() for line in lines if " version " in line), "")
    compile_line = next((line for line in lines if "cc1" in line), "")
    return CompilerTarget(compiler, version, target_options(compile_line))


def target_options(compile_line: str) -> tuple[str, ...]:
    """The target options of a driver's line for the compiler proper (gcc: every ``-m...`` and
    ``--param`` pair; clang: ``-triple``, ``-target-cpu`` and ``-target-feature`` with their values)."""
    try:
        words = shlex.split(compile_line)
    except ValueError:  # an unbalanced quote: the plain words still hold the options
        words = compile_line.split()
    kept: list[str] = []
    for i, word in enumerate(words):
        if word in CLANG_TARGET_OPTIONS or word == "--param":
            kept += words[i : i + 2]
        elif word.startswith("-m") and words[i - 1] not in CLANG_TARGET_OPTIONS:
            kept.append(word)
    return tuple(kept)
