"""The package's layout: no import circles, imports that run downward, rooms of a readable size."""

from __future__ import annotations

import ast
import re
import textwrap
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "specexec"
NOT_LIBRARY = ("tests", "build", "bench/reports")  #: folders that hold no library modules
MAX_MODULES_PER_FOLDER = 15
MAX_MODULE_LINES = 400
#: the executor's floors, top to bottom: a module may import its own floor and the floors below it
EXECUTOR_FLOORS = (
    "specexec.executor",
    "specexec.executor.engine",
    "specexec.executor.model",
    "specexec.executor.layers",
)


def library_files(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every module of the package whose folder is ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(rel.as_posix().startswith(f"{top}/") for top in NOT_LIBRARY) or rel.parts[0].startswith("."):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join([PACKAGE, *parts])] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports anywhere in its file (functions and TYPE_CHECKING too)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base_parts = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join(base_parts + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = library_files(root)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph (its modules in order, the first repeated at the end), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(graph[start])))]
        if start in done:
            continue
        path.append(start)
        on_path.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.discard(path.pop())
                done.add(node)
            elif child in on_path:
                return path[path.index(child) :] + [child]
            elif child not in done:
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
                on_path.add(child)
    return None


def test_the_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_sees_relative_function_level_and_type_checking_imports(tmp_path):
    files = {
        "__init__.py": "",
        "a/__init__.py": "from .b import x\n",
        "a/b.py": "x = 1\ndef f():\n    from ..c import d\n",
        "c/__init__.py": "",
        "c/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specexec.a import b\n",
        "tests/test_x.py": "from specexec.a import b\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    graph = import_graph(tmp_path)
    assert graph == {
        "specexec": set(),
        "specexec.a": {"specexec.a.b"},
        "specexec.a.b": {"specexec.c.d"},
        "specexec.c": set(),
        "specexec.c.d": {"specexec.a.b"},
    }
    assert find_cycle(graph) == ["specexec.a.b", "specexec.c.d", "specexec.a.b"]


def test_no_import_circles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def floor_of(module: str) -> int | None:
    """The executor floor a module lives on (0 = the front), or None outside the executor."""
    for i in reversed(range(len(EXECUTOR_FLOORS))):
        if module == EXECUTOR_FLOORS[i] or module.startswith(EXECUTOR_FLOORS[i] + "."):
            return i
    return None


def test_executor_imports_run_downward():
    upward = []
    for module, imported in import_graph().items():
        floor = floor_of(module)
        if floor is None:
            continue
        for dep in imported:
            dep_floor = floor_of(dep)
            if dep_floor is not None and dep_floor < floor:
                upward.append(f"{module} -> {dep}")
    assert not upward, "imports that run upward (front -> engine -> model -> layers):\n" + "\n".join(upward)


def test_leaves_import_nothing_of_ours_and_nothing_imports_bench():
    graph = import_graph()
    for leaf in ("specexec.kernels", "specexec.sampling"):
        for module, imported in graph.items():
            if module == leaf or module.startswith(leaf + "."):
                outside = [d for d in imported if not d.startswith(leaf)]
                assert not outside, f"{module} is in a leaf package but imports {outside}"
    for module, imported in graph.items():
        if module.startswith(("specexec.bench", "specexec.cli")):
            continue
        assert not [d for d in imported if d.startswith("specexec.bench")], f"{module} imports bench/"


def test_no_folder_holds_more_than_15_modules():
    folders: dict[Path, int] = {}
    for path in library_files().values():
        folders[path.parent] = folders.get(path.parent, 0) + 1
    crowded = {str(f.relative_to(ROOT)): n for f, n in folders.items() if n > MAX_MODULES_PER_FOLDER}
    assert not crowded, f"folders with more than {MAX_MODULES_PER_FOLDER} modules: {crowded}"


def long_modules() -> dict[str, int]:
    """Module file -> its lines, for the modules over MAX_MODULE_LINES."""
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in library_files().values()}
    return {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES}


def test_modules_over_400_lines_are_named_as_a_warning_not_a_failure():
    """Files are split where an idea ends, not where a count does: a long module is printed in pytest's
    warnings summary for its reader to judge, and never fails the suite. A plain UserWarning: pytest-xdist
    rebuilds a worker's warning in the main process from its class's module, and a class defined here
    (test_layout, importable only in the worker) took the worker down with it."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", UserWarning)  # recorded for the summary, not raised
        for name, lines in long_modules().items():
            warnings.warn(
                f"long module: {name} has {lines} lines (over {MAX_MODULE_LINES}): read it for a second "
                "idea to split out, not for a line to cut",
                UserWarning,
                stacklevel=1,
            )


def test_the_line_count_check_finds_a_long_module(tmp_path):
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n")
    sizes = {p.name: len(p.read_text().splitlines()) for p in library_files(tmp_path).values()}
    assert [n for n, lines in sizes.items() if lines > MAX_MODULE_LINES] == ["long.py"]


def test_pyproject_installs_every_package_folder():
    packages = re.search(
        r"^packages = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.DOTALL | re.MULTILINE
    )
    listed = set(re.findall(r'"([\w.]+)"', packages.group(1)))
    folders = {name for name, path in library_files().items() if path.name == "__init__.py"}
    assert folders == listed, f"missing from pyproject: {folders - listed}; stale: {listed - folders}"


#: modules outside the engine that use only the front's public surface (`Executor`'s methods and properties)
FRONT_USERS = ("server", "executor/async_executor.py", "bench")


def reaches_inside(source: str) -> list[str]:
    """``x.core`` and ``x._private`` (other than ``self._`` / ``cls._``) in a module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        private = name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
        own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        if name == "core" or (private and not own):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_server_the_async_front_and_bench_use_only_the_executors_public_surface():
    files = []
    for top in FRONT_USERS:
        path = ROOT / top
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    offenders = {}
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("bench/reports/"):
            continue
        if found := reaches_inside(path.read_text()):
            offenders[rel] = found
    assert not offenders, f"reaching the engine's insides: {offenders}"


def test_the_public_surface_check_finds_core_and_private_attributes():
    source = "def f(executor, self):\n    executor.core.queue_sizes()\n    executor._loop.step()\n    self._x = 1\n"
    assert reaches_inside(source) == ["line 2: executor.core", "line 3: executor._loop"]
