"""Builds specexec's C++ CPU kernels at install, one library per ISA level
(`executor/layers/kernel_build/isa_variants.py`); everything else is in pyproject.toml.

The kernels compile against the torch already installed in the environment pip installs into, found on
disk (its headers and libraries), never imported and never installed into pip's isolated build
environment: so no install pulls a CUDA build of torch. Install torch first (the README's command
does: ``pip install torch==2.13.0``); ``SPECEXEC_TORCH_DIR`` names another torch folder. Without torch
there, or without a C++ compiler with OpenMP, the install still succeeds without the libraries and
the kernels are built at first use instead, which the run says.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import site
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
LAYERS = Path("executor") / "layers"


def _load_variants():
    """`isa_variants.py` by its path (importing the package would import torch)."""
    path = ROOT / LAYERS / "kernel_build" / "isa_variants.py"
    spec = importlib.util.spec_from_file_location("_specexec_isa_variants", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


isa = _load_variants()


def find_torch() -> Path | None:
    """The installed torch's folder: ``$SPECEXEC_TORCH_DIR``, else the target environment's
    site-packages (this interpreter's, which pip's build isolation hides from ``sys.path`` only)."""
    if os.environ.get("SPECEXEC_TORCH_DIR"):
        candidates = [Path(os.environ["SPECEXEC_TORCH_DIR"]).parent]
    else:
        paths = sysconfig.get_paths()
        candidates = [Path(paths["purelib"]), Path(paths["platlib"])]
        with contextlib.suppress(AttributeError):  # (an old virtualenv's site module)
            candidates += [Path(p) for p in site.getsitepackages()]
        candidates.append(Path(site.getusersitepackages()))
    for folder in candidates:
        if (folder / "torch" / "include" / "torch" / "library.h").is_file():
            return folder / "torch"
    return None


def torch_version(torch_dir: Path) -> str:
    text = (torch_dir / "version.py").read_text()
    return re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text).group(1)


def torch_cxx11_abi(torch_dir: Path) -> str:
    """torch's ``_GLIBCXX_USE_CXX11_ABI``, as its CMake config records it (1 since torch 2.6)."""
    config = torch_dir / "share" / "cmake" / "Torch" / "TorchConfig.cmake"
    found = re.search(r"_GLIBCXX_USE_CXX11_ABI=(\d)", config.read_text()) if config.is_file() else None
    return found.group(1) if found else "1"


class BuildCpuKernels(build_ext):
    """build_ext with every variant compiled at once."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1


def cpu_kernel_extensions() -> list[Extension]:
    torch_dir = find_torch()
    if torch_dir is None or os.environ.get("SPECEXEC_CPU_KERNELS") == "0" or sys.platform != "linux":
        print(
            "specexec: no torch installed beside this install (or SPECEXEC_CPU_KERNELS=0): the C++ CPU "
            "kernels are built at first use instead (install torch==2.13.0 first to build them now)",
            file=sys.stderr,
        )
        return []
    version, digest = torch_version(torch_dir), isa.sources_digest(ROOT / LAYERS)
    extensions = []
    for variant in isa.VARIANTS:
        flags = [*isa.COMMON_FLAGS, *variant.march_flags]
        ext = Extension(
            f"specexec.executor.layers.{variant.module(digest, version)}",
            sources=[str(LAYERS / name) for name in isa.SOURCES],
            include_dirs=[
                str(torch_dir / "include"),
                str(torch_dir / "include" / "torch" / "csrc" / "api" / "include"),
            ],
            library_dirs=[str(torch_dir / "lib")],
            libraries=["c10", "torch", "torch_cpu"],
            extra_compile_args=[*flags, f"-D_GLIBCXX_USE_CXX11_ABI={torch_cxx11_abi(torch_dir)}"],
            extra_link_args=["-fopenmp", f"-Wl,-rpath,{torch_dir / 'lib'}"],
            language="c++",
            optional=True,  # a compiler that cannot build it: the install goes on, the run builds it
        )
        extensions.append(ext)
    return extensions


setup(ext_modules=cpu_kernel_extensions(), cmdclass={"build_ext": BuildCpuKernels})
