"""bench/reports holds records, not code of the package: its scripts use only the public API (`from specexec
import ...`, the `specexec` commands), and its data stays small (no per-request records, no file over 1 MB,
at most 1 MB a report). The wheel installs none of it (pyproject lists no package below bench/). The
scripts that remain are why test_layout.py's NOT_LIBRARY still exempts bench/reports: they are no
library modules."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import specexec

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "bench" / "reports"
MAX_FILE_BYTES = 1 << 20
MAX_REPORT_BYTES = 1 << 20


def internal_imports(source: str) -> list[str]:
    """The imports of specexec's insides in ``source``: ``specexec.<anything>``, or a name ``from specexec``
    that is not in its public ``__all__``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {a.name}" for a in node.names if a.name.startswith("specexec.")
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("specexec."):
                found.append(f"line {node.lineno}: from {node.module} import ...")
            elif node.module == "specexec":
                private = [a.name for a in node.names if a.name not in specexec.__all__]
                if private:
                    found.append(f"line {node.lineno}: from specexec import {', '.join(private)}")
    return found


def per_request_records(data) -> bool:
    """Whether a bench JSON holds a ``requests`` list of per-request records anywhere."""
    if isinstance(data, dict):
        records = data.get("requests")
        if isinstance(records, list) and any(isinstance(r, dict) for r in records):
            return True
        return any(per_request_records(v) for v in data.values())
    if isinstance(data, list):
        return any(per_request_records(v) for v in data)
    return False


def test_the_import_check_finds_internals_and_passes_the_public_api():
    source = (
        "import json\nfrom specexec import Executor, SamplingParams\nimport specexec\n"
        "from specexec.executor.config import ExecutorConfig\nimport specexec.cli\nfrom specexec import cli\n"
        "def f():\n    from specexec.prompt_sets.datasets import load_dataset\n"
    )
    assert internal_imports(source) == [
        "line 4: from specexec.executor.config import ...",
        "line 5: import specexec.cli",
        "line 6: from specexec import cli",
        "line 8: from specexec.prompt_sets.datasets import ...",
    ]
    assert per_request_records({"results": [{"name": "none", "passes": [{"requests": [{"id": 0}]}]}]})
    assert not per_request_records({"results": [{"name": "none", "num_requests": 3}]})


def test_report_scripts_use_only_the_public_api():
    found = {
        path.relative_to(ROOT).as_posix(): imports
        for path in sorted(REPORTS.rglob("*.py"))
        if (imports := internal_imports(path.read_text()))
    }
    assert not found, (
        "report scripts that import specexec internals (use `from specexec import ...` or `specexec bench`, "
        f"or remove the script and name its commit in the report's README): {found}"
    )


def test_report_data_stays_small():
    big = [
        f"{p.relative_to(ROOT)} ({p.stat().st_size:,} bytes)"
        for p in sorted(REPORTS.rglob("*"))
        if p.is_file() and p.stat().st_size > MAX_FILE_BYTES
    ]
    assert not big, f"files over 1 MB in bench/reports (keep a summary instead): {big}"
    heavy = {}
    for report in sorted(p for p in REPORTS.iterdir() if p.is_dir()):
        size = sum(p.stat().st_size for p in report.rglob("*") if p.is_file())
        if size > MAX_REPORT_BYTES:
            heavy[report.name] = size
    assert not heavy, f"reports over 1 MB of data: {heavy}"


def test_report_json_holds_no_per_request_records():
    found = []
    for path in sorted(REPORTS.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        if per_request_records(data):
            found.append(path.relative_to(ROOT).as_posix())
    assert not found, (
        f"bench JSON with per-request records (drop the 'requests' lists, keep the summary): {found}"
    )


def test_the_wheel_installs_no_report():
    pyproject = (ROOT / "pyproject.toml").read_text()
    packages = re.search(r"^packages = \[(.*?)\]", pyproject, re.DOTALL | re.MULTILINE)
    assert packages is not None
    assert not [
        p for p in re.findall(r'"([\w.]+)"', packages.group(1)) if p.startswith("specexec.bench.reports")
    ]
    data = re.search(
        r"^\[tool\.setuptools\.package-data\]\n(.*?)(?:^\[|\Z)", pyproject, re.DOTALL | re.MULTILINE
    )
    assert data is not None and "reports" not in data.group(1)
    assert not (ROOT / "MANIFEST.in").exists() or "reports" not in (ROOT / "MANIFEST.in").read_text()
