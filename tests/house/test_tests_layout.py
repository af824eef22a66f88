"""The tests' layout: one copy of each helper, in tests/, and no test module importing another.

A helper (a module-level function that is not a ``test_*``, fixtures included) is defined in one file
only: a second copy belongs in a shared module in tests/ (`factories`, `speculative_runs`, ...) with a
parameter for what differs, or gets a name that says what it does differently. A test module imports
helpers from tests/, never from a neighbouring ``test_*`` module (nor does a script a test writes).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
NOT_TESTS = ("data",)  #: folders under tests/ that hold no test code (a plugin package a test installs)

#: a line of a script a test writes out (a subprocess's source) that imports a test module
SCRIPT_IMPORT = re.compile(r"^\s*(?:from|import)\s+(test_\w+)", re.M)


def parsed_test_files(root: Path = TESTS) -> dict[str, ast.Module]:
    """Each Python file under ``root`` (a path relative to it) -> its parsed module."""
    files = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in NOT_TESTS or "__pycache__" in rel.parts:
            continue
        files[rel.as_posix()] = ast.parse(path.read_text(), filename=str(path))
    return files


def helpers_defined(module: ast.Module) -> set[str]:
    """The module-level functions that are not tests (fixtures included) nor pytest's hooks."""
    return {
        node.name
        for node in module.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and not node.name.startswith(("test_", "pytest_"))
    }


def imported_test_modules(module: ast.Module) -> set[str]:
    """The ``test_*`` modules a file imports anywhere (functions too), or a script it writes imports."""
    found = set()
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = SCRIPT_IMPORT.findall(node.value)
        else:
            continue
        found |= {name.split(".")[0] for name in names if name.split(".")[0].startswith("test_")}
    return found


def duplicated_helpers(files: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Helper name -> the files defining it, where two or more do."""
    where = defaultdict(list)
    for rel, module in files.items():
        for name in helpers_defined(module):
            where[name].append(rel)
    return {name: rels for name, rels in sorted(where.items()) if len(rels) > 1}


def neighbour_imports(files: dict[str, ast.Module]) -> dict[str, list[str]]:
    """File -> the test modules it imports."""
    found = {rel: sorted(imported_test_modules(module)) for rel, module in files.items()}
    return {rel: mods for rel, mods in found.items() if mods}


def test_no_helper_is_defined_in_two_test_files():
    duplicated = duplicated_helpers(parsed_test_files())
    assert not duplicated, "one copy of each helper, in a shared module in tests/:\n" + "\n".join(
        f"  {name}: {', '.join(rels)}" for name, rels in duplicated.items()
    )


def test_no_test_module_imports_another():
    found = neighbour_imports(parsed_test_files())
    assert not found, "import helpers from tests/, not from a test module:\n" + "\n".join(
        f"  {rel} imports {', '.join(mods)}" for rel, mods in found.items()
    )


def test_the_checks_find_a_second_copy_and_an_imported_test_module(tmp_path):
    FROM = "from"  # (apart, so that this file's own strings import no test module)
    (tmp_path / "engine").mkdir()
    (tmp_path / "helpers.py").write_text(
        "def make_thing():\n    pass\n\n\ndef pytest_configure(config):\n    pass\n"
    )
    (tmp_path / "engine" / "test_a.py").write_text(
        "import pytest\n\n\n@pytest.fixture\ndef make_thing():\n    pass\n\n\ndef pytest_configure(config):\n"
        f"    pass\n\n\ndef test_one():\n    {FROM} test_b import X\n"
    )
    (tmp_path / "engine" / "test_b.py").write_text(
        f"X = 1\n\n\ndef test_one():\n    script = 'import sys\\n{FROM} test_a import y\\n'\n"
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "plugin.py").write_text("def make_thing():\n    pass\n")
    files = parsed_test_files(tmp_path)
    assert duplicated_helpers(files) == {"make_thing": ["engine/test_a.py", "helpers.py"]}
    assert neighbour_imports(files) == {"engine/test_a.py": ["test_b"], "engine/test_b.py": ["test_a"]}
