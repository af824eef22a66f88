"""The C++ CPU kernels' cache and the measurement caches are keyed by what decides them (the compiler's
target, every CPU flag), not by a CPU's name: a cache made on one CPU is never loaded on another that
shares its name (a VM's "Intel(R) Xeon(R) Processor" with and without AVX512-FP16 and AMX)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.utils.cpp_extension
from specexec.executor.layers import cpu_info
from specexec.executor.layers import cpu_kernels as kernels_module

NAME = "Intel(R) Xeon(R) Processor"
#: two VMs' CPUs of one name: the richer one has AVX512-FP16 and AMX tiles besides
RICH_FLAGS = "fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 avx512_fp16 amx_tile amx_int8 gfni"
PLAIN_FLAGS = "fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_bf16"


def make_cpuinfo(flags: str, name: str = NAME) -> tuple[str, ...]:
    return ("processor\t: 0", "vendor_id\t: GenuineIntel", f"model name\t: {name}", f"flags\t\t: {flags}")


class FakeBuild:
    """Stands in for torch's cpp_extension ``load``: notes the folder it was asked to build in and the
    files it found there, then leaves a ``.so`` and an object file as a real build would."""

    def __init__(self, fail: Exception | None = None):
        self.calls: list[tuple[Path, set[str]]] = []
        self.fail = fail

    def __call__(self, name, sources, build_directory, **kwargs):
        folder = Path(build_directory)
        self.calls.append((folder, {p.name for p in folder.iterdir()}))
        if self.fail is not None:
            raise self.fail
        (folder / "fused_ops_cpu.o").write_text("object code")
        (folder / f"{name}.so").write_text(f"built in {folder}")


@pytest.fixture
def fake_build(monkeypatch, tmp_path):
    """A fake build into a fresh cache folder; the real kernels come back for the tests after this."""
    build = FakeBuild()
    monkeypatch.setenv("SPECEXEC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(kernels_module.SWITCH, raising=False)
    monkeypatch.setattr(torch.utils.cpp_extension, "load", build)
    monkeypatch.setattr(kernels_module, "installed_library", lambda: None)  # (the build at first use)
    kernels_module.cpu_kernels.cache_clear()
    yield build
    kernels_module.cpu_kernels.cache_clear()


def load_on(monkeypatch, cpuinfo: tuple[str, ...]):
    monkeypatch.setattr(cpu_info, "_cpuinfo", lambda: cpuinfo)
    kernels_module.cpu_kernels.cache_clear()
    return kernels_module.cpu_kernels()


def has_build(files: set[str]) -> bool:
    return any(name.endswith((".so", ".o")) for name in files)


def test_a_build_made_on_one_cpu_is_not_loaded_on_another_of_the_same_name(monkeypatch, fake_build):
    """The old key (the name and five flags) was the same for both CPUs: the richer one's build was
    loaded on the plainer one, which dies with SIGILL at its first AVX512-FP16 instruction."""
    load_on(monkeypatch, make_cpuinfo(RICH_FLAGS))
    load_on(monkeypatch, make_cpuinfo(PLAIN_FLAGS))
    (rich_folder, _), (plain_folder, plain_found) = fake_build.calls
    assert not has_build(plain_found), f"the plainer CPU found the richer one's build: {plain_found}"
    assert plain_folder != rich_folder
    load_on(monkeypatch, make_cpuinfo(RICH_FLAGS))
    assert fake_build.calls[-1][0] == rich_folder, "back on the first CPU: its own build again"
    assert has_build(fake_build.calls[-1][1])


@pytest.mark.parametrize("record", ["another target", "none"])
def test_a_build_folder_that_does_not_record_this_target_is_built_again(monkeypatch, fake_build, record):
    """A folder copied from elsewhere (an image, a CI cache) whose record names another target, or
    that records none, loses its build before anything loads from it."""
    cpuinfo = make_cpuinfo(RICH_FLAGS)
    load_on(monkeypatch, cpuinfo)
    folder = fake_build.calls[0][0]
    recorded = folder / kernels_module.RECORD
    if record == "none":
        recorded.unlink(missing_ok=True)
    else:
        other = {**json.loads(recorded.read_text()), "target": "-march=sapphirerapids -mavx512fp16"}
        recorded.write_text(json.dumps(other))
    assert any(folder.glob("*.so"))
    load_on(monkeypatch, cpuinfo)
    again, found = fake_build.calls[-1]
    assert again == folder
    assert not has_build(found), f"built for another target, then loaded here: {found}"
    assert json.loads(recorded.read_text()) == kernels_module.build_identity()


def test_the_build_key_records_the_compilers_expansion_of_march_native(monkeypatch, fake_build):
    load_on(monkeypatch, make_cpuinfo(PLAIN_FLAGS))
    record = json.loads((fake_build.calls[0][0] / kernels_module.RECORD).read_text())
    assert "-march=" in record["target"] or "-target-cpu" in record["target"], record
    assert record["compiler_version"] and record["torch"] == torch.__version__
    assert record["cflags"] == " ".join(kernels_module.CFLAGS)


def test_every_header_the_sources_include_is_part_of_a_builds_identity():
    """A header missing from `HEADERS` could change without a rebuild: the old build would be loaded."""
    import re

    included = set()
    for source in (*kernels_module.SOURCES, *kernels_module.HEADERS):
        for name in re.findall(r'^#include "([^"]+)"', source.read_text(), flags=re.MULTILINE):
            included.add((source.parent / name).resolve())
    assert included, "the sources include headers of their own"
    assert included <= {header.resolve() for header in kernels_module.HEADERS}


def test_the_build_folder_is_the_same_from_run_to_run(tmp_path):
    """Nothing in the key changes between runs on one machine (the working folder, a process id): a
    second run loads the first one's build instead of spending half a minute building again."""
    script = (
        "from specexec.executor.layers.cpu_kernels import build_folder, build_identity\n"
        "print(build_folder(build_identity()))"
    )
    folders = []
    for cwd in (tmp_path, Path.home()):
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        folders.append(done.stdout.strip())
    assert folders[0] == folders[1] and "specexec_cpu_" in folders[0]


def test_with_the_switch_at_1_a_failed_build_is_an_error(monkeypatch, fake_build):
    """Without a compiler every kernel falls back to torch, and none of the published CPU figures
    apply: ``SPECEXEC_CPU_KERNELS=1`` says so by failing instead."""
    fake_build.fail = RuntimeError("c++: command not found")
    monkeypatch.setattr(cpu_info, "_cpuinfo", lambda: make_cpuinfo(PLAIN_FLAGS))
    monkeypatch.setenv(kernels_module.SWITCH, "1")
    with pytest.raises(RuntimeError, match="command not found"):
        kernels_module.cpu_kernels()
    monkeypatch.delenv(kernels_module.SWITCH)
    assert kernels_module.cpu_kernels() is None, "unset: torch ops, as before"
    assert kernels_module.describe_cpu_kernels().startswith("torch (the C++ build failed")
    monkeypatch.setenv(kernels_module.SWITCH, "yes")
    kernels_module.cpu_kernels.cache_clear()
    with pytest.raises(ValueError, match=kernels_module.SWITCH):
        kernels_module.cpu_kernels()


def test_the_first_build_is_announced_on_stderr_where_no_logging_shows_it(monkeypatch, fake_build, capsys):
    """A plain ``Executor()`` in a script has no logging set up: the half-minute pause is said anyway,
    with its honest length; the second run, which loads, says nothing."""
    load_on(monkeypatch, make_cpuinfo(PLAIN_FLAGS))
    err = capsys.readouterr().err
    assert "building specexec's C++ CPU kernels" in err and kernels_module.FIRST_BUILD_TIME in err, err
    load_on(monkeypatch, make_cpuinfo(PLAIN_FLAGS))
    assert "building" not in capsys.readouterr().err


def test_the_first_build_is_announced_on_the_loading_log_where_it_shows(monkeypatch, fake_build, capsys):
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    loading = logging.getLogger("specexec.loading")
    saved = loading.level
    loading.addHandler(handler)
    loading.setLevel(logging.INFO)
    try:
        load_on(monkeypatch, make_cpuinfo(PLAIN_FLAGS))
    finally:
        loading.removeHandler(handler)
        loading.setLevel(saved)
    assert any(kernels_module.FIRST_BUILD_TIME in line for line in lines), lines
    # (an earlier test's handler may echo the log to stderr; the direct line is what must not come too)
    assert "specexec: building" not in capsys.readouterr().err, "said once, not twice"


class Captured(Exception):
    """Stops a measurement at its cache lookup, holding the key it asked for."""


def capture_key(*args, **kwargs):
    raise Captured(args[2])


def key_of(monkeypatch, cache: str) -> str:
    """The key one measurement cache asks for on the CPU `cpu_info._cpuinfo` now reports."""
    from specexec.executor.kernel_plan import attention_path as attention_paths
    from specexec.executor.kernel_plan import dense_backend as linear_backend
    from specexec.executor.kernel_plan import dtype as dtype_choice
    from specexec.executor.kernel_plan import head_quantization, quantized_kernel
    from specexec.executor.kernel_plan.forward_cost import cost_cache_key
    from tiny_models import make_tiny_model

    shape = dtype_choice.ModelShape(64, 128, 4, 2, 16, 2, 100)
    layers = [SimpleNamespace(scheme="int8", in_features=64, out_features=128)]
    for module in (dtype_choice, attention_paths, head_quantization):
        monkeypatch.setattr(module, "cached_measurement", capture_key)
    monkeypatch.setattr(quantized_kernel, "cached_row_ratios", capture_key)
    monkeypatch.setattr(attention_paths, "cpu_kernels", lambda: None)
    measurements = {
        "dtype-choice": lambda: dtype_choice._cached_bf16_ratio(shape, Path("."), None),
        "linear-backend": lambda: linear_backend._measurement_key(shape, torch.float32, None),
        "attention-paths": lambda: attention_paths.choose_attention_paths(
            4, 2, 16, torch.float32, torch.device("cpu"), Path(".")
        ),
        "quantized-kernel": lambda: quantized_kernel._cached_ratios(layers, torch.float32, Path(".")),
        "eagle3-head": lambda: head_quantization._cached_times(((64, 128),), torch.float32, Path(".")),
        "forward-cost": lambda: cost_cache_key(make_tiny_model("llama", dtype=torch.float32)[1]),
    }
    try:
        return measurements[cache]()
    except Captured as captured:
        return captured.args[0]


@pytest.mark.parametrize(
    "cache",
    ["dtype-choice", "linear-backend", "attention-paths", "quantized-kernel", "eagle3-head", "forward-cost"],
)
def test_a_measurement_made_on_one_cpu_is_not_read_on_another_of_the_same_name(monkeypatch, cache):
    monkeypatch.setattr(cpu_info, "_cpuinfo", lambda: make_cpuinfo(RICH_FLAGS))
    rich = key_of(monkeypatch, cache)
    monkeypatch.setattr(cpu_info, "_cpuinfo", lambda: make_cpuinfo(PLAIN_FLAGS))
    plain = key_of(monkeypatch, cache)
    assert NAME in rich and NAME in plain, "the key still reads as the CPU's name"
    assert rich != plain
    assert key_of(monkeypatch, cache) == plain, "and is the same on the same CPU"


def test_an_aarch64_cpu_is_named_and_keyed_by_its_part_and_features(monkeypatch):
    """aarch64's /proc/cpuinfo has no model name (every CPU was "unknown CPU") and calls its flags
    "Features"."""

    def arm(features: str, part: str) -> tuple[str, ...]:
        return ("processor\t: 0", f"Features\t: {features}", "CPU implementer\t: 0x41", f"CPU part\t: {part}")

    monkeypatch.setattr(cpu_info, "_cpuinfo", lambda: arm("fp asimd sve i8mm bf16", "0xd4f"))
    neoverse_v2 = cpu_info.cpu_key()
    assert "0xd4f" in cpu_info.describe_cpu() and "sve" in cpu_info.describe_cpu()
    monkeypatch.setattr(cpu_info, "_cpuinfo", lambda: arm("fp asimd", "0xd0c"))
    assert cpu_info.cpu_key() != neoverse_v2
    monkeypatch.setattr(cpu_info, "_cpuinfo", lambda: arm("fp asimd", "0xd4f"))
    assert cpu_info.cpu_key() != neoverse_v2, "one part, fewer features: another key"


def test_the_target_is_read_from_gcc_and_clang_dry_runs_without_their_paths():
    """gcc's line for cc1plus and clang's for -cc1 name the target among paths and the working folder;
    only the target is kept, so the key does not change with the folder a run starts in."""
    from specexec.executor.layers.kernel_build.compiler_target import CompilerTarget, target_options

    gcc = (
        " /usr/lib/gcc/x86_64-linux-gnu/12/cc1plus -E -quiet -imultiarch x86_64-linux-gnu /dev/null"
        ' "-march=znver3" -mavx512f -mno-amx-tile --param "l1-cache-size=32" "-mtune=znver3" -dumpbase null'
    )
    options = target_options(gcc)
    assert options == (
        "-march=znver3",
        "-mavx512f",
        "-mno-amx-tile",
        "--param",
        "l1-cache-size=32",
        "-mtune=znver3",
    )
    assert CompilerTarget("g++", "gcc version 12", options).cpu == "znver3"
    clang = (
        ' "/usr/lib/llvm-16/bin/clang" "-cc1" "-triple" "x86_64-pc-linux-gnu" "-E"'
        ' "-fdebug-compilation-dir=/home/me/work" "-target-cpu" "sapphirerapids"'
        ' "-target-feature" "+avx512fp16" "-target-feature" "-mmx"'
    )
    options = target_options(clang)
    assert options == (
        "-triple", "x86_64-pc-linux-gnu", "-target-cpu", "sapphirerapids",
        "-target-feature", "+avx512fp16", "-target-feature", "-mmx",
    )  # fmt: skip
    assert CompilerTarget("clang++", "clang version 16", options).cpu == "sapphirerapids"


def test_this_machines_compiler_names_the_cpu_it_targets():
    from specexec.executor.layers.kernel_build.compiler_target import compiler_command, compiler_target

    target = compiler_target(compiler_command(), kernels_module.CFLAGS)
    assert target.cpu and target.cpu != "native", target
    assert " version " in target.version


@pytest.mark.parametrize(
    "cache",
    ["dtype-choice", "linear-backend", "attention-paths", "quantized-kernel", "eagle3-head", "forward-cost"],
)
def test_a_measurement_made_with_other_kernel_sources_is_not_read(monkeypatch, cache):
    """An upgrade that changes a kernel (its sources or flags) is timed again: the old build's figures
    (a forward-cost curve from before a 1.5x faster verify) would steer the new one."""
    monkeypatch.setattr(kernels_module, "_sources_digest", lambda: "before")
    before = key_of(monkeypatch, cache)
    monkeypatch.setattr(kernels_module, "_sources_digest", lambda: "after")
    after = key_of(monkeypatch, cache)
    assert before != after
    assert key_of(monkeypatch, cache) == after, "and is the same for the same sources"
    monkeypatch.setenv(kernels_module.SWITCH, "0")
    assert key_of(monkeypatch, cache) not in (before, after), "torch ops are their own measurement"


def test_a_march_target_given_by_the_environment_is_its_own_build_and_measurement(monkeypatch):
    """SPECEXEC_CPU_MARCH=x86-64-v3 builds for AVX2 alone (an estimate of an AVX2-only CPU): its own build
    folder, its own key for the measurements, and the compiler's expansion of that target recorded."""
    monkeypatch.delenv(kernels_module.MARCH, raising=False)
    native = kernels_module.build_identity(), kernels_module.kernels_key()
    monkeypatch.setenv(kernels_module.MARCH, "x86-64-v3")
    avx2 = kernels_module.build_identity(), kernels_module.kernels_key()
    assert "-march=x86-64-v3" in avx2[0]["cflags"] and "-march=native" not in avx2[0]["cflags"]
    assert avx2[0]["target"] != native[0]["target"], "the compiler's expansion of the target, not native's"
    assert kernels_module.build_folder(avx2[0]) != kernels_module.build_folder(native[0])
    assert avx2[1] != native[1]
    monkeypatch.setenv(kernels_module.MARCH, "x86-64-v3; rm -rf /")
    with pytest.raises(ValueError, match="must name a -march target"):
        kernels_module.cflags()


@pytest.mark.parametrize("cache", ["dtype-choice", "forward-cost"])
def test_torchs_kernels_held_to_avx2_are_their_own_measurement(monkeypatch, cache):
    """ATEN_CPU_CAPABILITY=avx2 (an AVX2-only CPU estimated on this one) times torch's kernels apart from
    the native ones: neither reads the other's figures."""
    native = key_of(monkeypatch, cache)
    held = "AVX2" if torch.backends.cpu.get_cpu_capability() != "AVX2" else "DEFAULT"  # (on an AVX2-only CPU)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: held)
    assert key_of(monkeypatch, cache) != native
