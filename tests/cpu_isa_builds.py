"""One C++ CPU source built for an instruction set other than this CPU's best (AVX2, plain x86-64,
AVX-VNNI), with the flags production builds use (`cpu_kernels.CFLAGS`, its ``-march=native`` replaced
by the ISA's flags): run in a subprocess where this CPU can run the build, else compiled to assembly,
so that every branch of the source is at least compiled by the tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from specexec.executor.layers.cpu_kernels import CFLAGS

#: what a production build adds to ``-march``: the optimization level, OpenMP, no errno
PRODUCTION_FLAGS = tuple(flag for flag in CFLAGS if not flag.startswith("-march"))

RUNNER = textwrap.dedent(
    """
    import os, sys, torch
    from torch.utils.cpp_extension import load
    name, build, sources, inputs, out, body = sys.argv[1:7]
    flags = sys.argv[7:]
    load(name=name, sources=sources.split(os.pathsep), extra_cflags=flags, extra_ldflags=["-fopenmp"],
         build_directory=build, is_python_module=False, verbose=False)
    ops, inputs = torch.ops.specexec_cpu, torch.load(inputs)
    scope = {"ops": ops, "inputs": inputs, "torch": torch}
    exec(body, scope)
    torch.save(scope["result"], out)
    """
)


def cpu_flags() -> set[str]:
    """This CPU's feature flags as /proc/cpuinfo lists them (avx2, avx_vnni, avx512_vnni, ...)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def require_x86_64_linux_with_avx2() -> None:
    if not (sys.platform == "linux" and "avx2" in cpu_flags()):
        pytest.fail("this check builds x86-64 code: it needs an x86-64 Linux machine with AVX2, as CI has")


def run_build(tmp_path: Path, source: Path | list[Path], isa_flags: list[str], inputs, body: str):
    """Build ``source`` (one C++ file, or several) with the production flags and ``isa_flags`` in a fresh process, run ``body``
    there (Python that sees ``ops``, ``inputs`` and ``torch``, and sets ``result``), return its result."""
    name = "isa_" + "_".join(isa_flags).replace("-", "_").replace("=", "_")
    build = tmp_path / name
    build.mkdir()
    torch.save(inputs, build / "inputs.pt")
    (build / "runner.py").write_text(RUNNER)
    sources = os.pathsep.join(str(s) for s in (source if isinstance(source, list) else [source]))
    args = [name, str(build), sources, str(build / "inputs.pt"), str(build / "out.pt"), body]
    flags = [*PRODUCTION_FLAGS, *isa_flags]
    subprocess.run([sys.executable, str(build / "runner.py"), *args, *flags], check=True, timeout=600)
    return torch.load(build / "out.pt")


def compile_to_assembly(tmp_path: Path, source: Path, isa_flags: list[str]) -> str:
    """``source`` compiled (not assembled, not run: for an ISA this CPU may lack) with the production
    flags and ``isa_flags``, as torch's extension builds compile it; the assembly text."""
    from torch.utils.cpp_extension import include_paths

    out = tmp_path / (source.stem + ".s")
    command = [os.environ.get("CXX", "c++"), "-std=c++20", "-fPIC", "-S", "-o", str(out), str(source)]
    command += [f"-isystem{path}" for path in include_paths()]
    command += [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    command += [*PRODUCTION_FLAGS, *isa_flags]
    subprocess.run(command, check=True, timeout=600, capture_output=True)
    return out.read_text()
