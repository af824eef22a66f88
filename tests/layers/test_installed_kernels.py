"""The C++ CPU kernels are built when the package is installed (`setup.py`), one library per ISA
level; a run loads the one this CPU runs and compiles nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from specexec.executor.layers import cpu_info
from specexec.executor.layers import cpu_kernels as kernels_module
from specexec.executor.layers.kernel_build import isa_variants

AVX2 = "avx2 fma f16c bmi2 movbe"
AVX512 = AVX2 + " avx512f avx512bw avx512dq avx512vl avx512cd"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (AVX512 + " avx512_vnni avx512_bf16 amx_tile amx_bf16", "avx512_bf16"),  # Sapphire Rapids
        (AVX512 + " avx512_vnni avx512_bf16", "avx512_bf16"),  # EPYC Zen 4 / Zen 5
        (AVX512 + " avx512_vnni", "avx512_vnni"),  # Ice Lake, Cascade Lake
        (AVX512, "avx2"),  # Skylake-SP: AVX-512 without VNNI
        (AVX2, "avx2"),  # EPYC Zen 2 / Zen 3
        ("sse4_2 avx", None),  # below x86-64-v3: the build at first use (-march=native)
    ],
)
def test_each_cpu_runs_the_richest_level_it_reports(flags, expected):
    variant = isa_variants.variant_for(frozenset(flags.split()))
    assert (variant.name if variant else None) == expected


def test_a_library_is_found_only_under_the_name_of_these_sources_and_this_torch(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_info, "_cpuinfo", lambda: (f"flags\t\t: {AVX2}",))
    monkeypatch.delenv(kernels_module.MARCH, raising=False)
    avx2 = next(v for v in isa_variants.VARIANTS if v.name == "avx2")
    suffix = ".cpython-311-x86_64-linux-gnu.so"
    (tmp_path / f"{avx2.module('other sources', torch.__version__)}{suffix}").write_text("")
    (tmp_path / f"{avx2.module(kernels_module._sources_digest(), '2.0.0')}{suffix}").write_text("")
    assert kernels_module.installed_library(tmp_path) is None
    good = tmp_path / f"{avx2.module(kernels_module._sources_digest(), torch.__version__)}{suffix}"
    good.write_text("")
    monkeypatch.setattr(kernels_module.importlib.machinery, "EXTENSION_SUFFIXES", [suffix])
    assert kernels_module.installed_library(tmp_path) == good


def test_an_avx2_estimate_runs_the_avx2_library_and_another_march_builds_at_first_use(monkeypatch):
    monkeypatch.setenv(kernels_module.MARCH, "x86-64-v3")
    assert kernels_module.installed_variant().name == "avx2"
    monkeypatch.setenv(kernels_module.MARCH, "znver4")
    assert kernels_module.installed_variant() is None


def test_an_installed_package_runs_its_kernels_without_compiling():
    """In a fresh process, as a run starts: the library built at install loads; nothing is compiled
    (torch's cpp_extension is never imported). Fails where the install could not build them (a
    missing compiler) or a source was edited since: ``pip install -e .`` builds them again."""
    if isa_variants.variant_for(cpu_info.cpu_flags()) is None:
        pytest.fail("this test machine is below x86-64-v3: no library is built for it")
    code = (
        "import sys, torch\n"
        "from specexec.executor.layers import cpu_kernels as k\n"
        "assert k.installed_library() is not None, 'no library for these sources: pip install -e . builds them'\n"
        "assert k.cpu_kernels() is not None\n"
        "assert 'torch.utils.cpp_extension' not in sys.modules, 'a build ran'\n"
        "print(k.describe_cpu_kernels())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "built at install" in done.stdout
