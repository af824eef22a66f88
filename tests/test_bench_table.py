"""The benchmark table: ``valid`` means something only in a ``--guided`` run."""

from __future__ import annotations

from specexec.bench.records import RequestRecord, summarize
from specexec.bench.report import format_table


def table_row(guided: bool) -> list[str]:
    record = RequestRecord("p0", 10, 5, 100.0, 20.0, 10.0, schema_valid=False)
    row = summarize("none", 1, [record], 0.1)
    row["speedup"] = {}
    return format_table([row], guided=guided).splitlines()[2].split()


def test_valid_is_a_dash_without_guided_and_a_share_with_it():
    unguided, guided = table_row(False), table_row(True)  # ..., valid, vs none, vs hf
    assert unguided[-3] == "-" and guided[-3] == "0%"


def test_an_empty_run_still_prints_the_header():
    assert format_table([]).splitlines()[0].startswith("name")


def test_the_legend_explains_every_column():
    from specexec.bench.report import COLUMNS, LEGEND

    explained = {line.split()[0] for line in LEGEND.splitlines() if line and not line.startswith(" ")}
    for header, _ in COLUMNS:
        if header in ("name", "c", "n"):
            continue
        assert header.split()[0] in explained or header in LEGEND, header
    assert "prefill" in LEGEND and "c=1" in LEGEND, "why tok/s/user can exceed tok/s at c=1"


def test_the_readme_shows_the_legend_as_printed():
    from pathlib import Path

    import specexec
    from specexec.bench.report import LEGEND

    readme = (Path(specexec.__file__).parent / "README.md").read_text()
    for line in LEGEND.splitlines():
        if not line.startswith("timing:") and not line.startswith(" "):
            assert line in readme, line
