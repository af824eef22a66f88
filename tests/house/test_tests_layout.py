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

#: Owned by the drafter rewrite, to be deleted: the copies in these files of helpers that now live in
#: tests/ (speculative_runs, sampled_distribution, eagle3_heads, fake_requests, oracle_tree_drafter,
#: capture_checks, factories), and same-named helpers of theirs that are to be renamed or folded. Their
#: owner deletes each entry with its definition; an entry whose definition is gone fails below.
DUPLICATES_TO_DELETE = {
    "engine/test_speculative_identity.py": {
        "make_batch_prompts", "make_config", "drafting_every_step", "make_requests", "_reference",
        "reference", "run_speculative", "num_accepted", "num_drafted", "make_independent_draft_model",
        "replay_captured_forwards", "graph_stats",
    },
    "engine/test_speculative_distribution.py": {
        "make_target", "make_config", "make_requests", "exact_distribution", "adjusted_distribution",
        "chi_square_p_value", "plain_samples", "sample_sequences", "make_drafter",
    },
    "drafters/test_eagle3.py": {"make_head_dir", "eagle_spec", "dense_causal_attention", "reference_drafts"},
    "drafters/test_eagle3_training.py": {"make_features", "tiny_training_argv"},
    "drafters/test_eagle3_training_precision.py": {"tiny_training_argv"},
    "drafters/test_ngram_drafter.py": {"reference_drafts", "make_drafter", "drafts"},
    "drafters/test_suffix_drafter.py": {"drafts"},
    "drafters/test_drafter_plugins.py": {"make_config", "make_executor"},
    "drafters/test_medusa.py": {"make_executor"},
}  # fmt: skip
#: Owned by the drafter rewrite, to be deleted: imports of a neighbouring test module in these files
#: (each name they import has a copy in a shared helper module in tests/).
TEST_IMPORTS_TO_DELETE = {
    "engine/test_speculative_identity.py": {"test_eagle3"},
    "engine/test_speculative_distribution.py": {"test_eagle3"},
    "drafters/test_drafter_binding.py": {"test_eagle3"},
    "drafters/test_drafter_plugins.py": {"test_speculative_identity"},
    "drafters/test_eagle3.py": {"test_speculative_identity"},
    "drafters/test_eagle3_dynamic_tree.py": {"test_eagle3"},
    "drafters/test_eagle3_eval.py": {"test_speculative_identity"},
    "drafters/test_eagle3_training.py": {"test_eagle3", "test_speculative_identity"},
    "drafters/test_eagle3_training_precision.py": {"test_eagle3", "test_eagle3_training"},
    "drafters/test_head_quantization.py": {"test_eagle3", "test_speculative_identity"},
    "drafters/test_layer_skip.py": {"test_speculative_identity", "test_grammar_support"},
    "drafters/test_lookahead.py": {"test_speculative_identity"},
    "drafters/test_medusa.py": {"test_speculative_identity"},
    "drafters/test_rest_drafter.py": {"test_grammar_support", "test_ngram_drafter", "test_speculative_identity"},
    "drafters/test_suffix_drafter.py": {"test_ngram_drafter"},
    "drafters/test_tree_drafting.py": {"test_speculative_distribution", "test_speculative_identity", "test_eagle3"},
}  # fmt: skip
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


def duplicated_helpers(files: dict[str, ast.Module], allowed: dict[str, set[str]]) -> dict[str, list[str]]:
    """Helper name -> the files defining it, where two or more do (``allowed`` definitions not counted)."""
    where = defaultdict(list)
    for rel, module in files.items():
        for name in helpers_defined(module) - allowed.get(rel, set()):
            where[name].append(rel)
    return {name: rels for name, rels in sorted(where.items()) if len(rels) > 1}


def neighbour_imports(files: dict[str, ast.Module], allowed: dict[str, set[str]]) -> dict[str, list[str]]:
    """File -> the test modules it imports (``allowed`` ones not counted)."""
    found = {
        rel: sorted(imported_test_modules(module) - allowed.get(rel, set())) for rel, module in files.items()
    }
    return {rel: mods for rel, mods in found.items() if mods}


def test_no_helper_is_defined_in_two_test_files():
    duplicated = duplicated_helpers(parsed_test_files(), DUPLICATES_TO_DELETE)
    assert not duplicated, "one copy of each helper, in a shared module in tests/:\n" + "\n".join(
        f"  {name}: {', '.join(rels)}" for name, rels in duplicated.items()
    )


def test_no_test_module_imports_another():
    found = neighbour_imports(parsed_test_files(), TEST_IMPORTS_TO_DELETE)
    assert not found, "import helpers from tests/, not from a test module:\n" + "\n".join(
        f"  {rel} imports {', '.join(mods)}" for rel, mods in found.items()
    )


def test_the_allow_lists_name_only_what_is_still_there():
    """An entry goes with the definition or import it names (and only the drafter rewrite's files have any)."""
    files = parsed_test_files()
    stale = [
        f"{rel}: {name}"
        for rel, names in DUPLICATES_TO_DELETE.items()
        for name in sorted(names - helpers_defined(files[rel]) if rel in files else names)
    ]
    stale += [
        f"{rel}: imports {name}"
        for rel, names in TEST_IMPORTS_TO_DELETE.items()
        for name in sorted(names - imported_test_modules(files[rel]) if rel in files else names)
    ]
    assert not stale, "no longer there, drop from the allow-lists:\n  " + "\n  ".join(stale)
    owned = {
        rel for rel in [*DUPLICATES_TO_DELETE, *TEST_IMPORTS_TO_DELETE] if not rel.startswith("drafters/")
    }
    assert owned <= {"engine/test_speculative_identity.py", "engine/test_speculative_distribution.py"}


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
    assert duplicated_helpers(files, {}) == {"make_thing": ["engine/test_a.py", "helpers.py"]}
    assert duplicated_helpers(files, {"helpers.py": {"make_thing"}}) == {}
    assert neighbour_imports(files, {}) == {"engine/test_a.py": ["test_b"], "engine/test_b.py": ["test_a"]}
