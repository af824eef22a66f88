"""The README and docs/ stay true to the tree: every relative link resolves, every `specexec ...` command
the README shows parses, and its YAML example is a valid config."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from specexec.cli import _build_parser
from specexec.executor.config import ExecutorConfig

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
MAX_README_LINES = 119  # under 120: a page a newcomer takes in at a glance


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(h) for h in re.findall(r"^#+\s+(.*)$", text, re.MULTILINE)}


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def readme_commands() -> list[str]:
    """Every `specexec ...` command in the README's shell blocks (also after `&&`)."""
    commands = []
    for lang, body in FENCE.findall((ROOT / "README.md").read_text()):
        if lang not in ("bash", "sh", "shell", "console"):
            continue
        for line in body.splitlines():
            for part in line.split("&&"):
                part = part.strip()
                if part.startswith("specexec "):
                    commands.append(part)
    return commands


def test_the_anchor_rule_and_the_command_finder_see_what_they_should():
    assert slug("CPU linear kernels (`cpu_linear`)") == "cpu-linear-kernels-cpu_linear"
    assert any(c.startswith("specexec run ") for c in readme_commands()), "the set-up command runs specexec"
    assert len(PAGES) > 5


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


@pytest.mark.parametrize("command", readme_commands())
def test_every_readme_command_parses(command, capsys):
    argv = shlex.split(command)[1:]
    try:
        _build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"`{command}` does not parse: {capsys.readouterr().err.strip()} (exit {exc.code})")


def test_the_readme_yaml_example_is_a_valid_config():
    blocks = [body for lang, body in FENCE.findall((ROOT / "README.md").read_text()) if lang == "yaml"]
    assert blocks, "the README shows a YAML example"
    for body in blocks:
        ExecutorConfig.from_dict(yaml.safe_load(body))


def test_the_readme_is_a_page():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; topics belong in docs/"
