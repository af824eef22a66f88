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
    unguided, guided = table_row(False), table_row(True)  # ..., valid, cached%, vs none, vs hf
    assert unguided[-4] == "-" and guided[-4] == "0%"


def test_an_empty_run_still_prints_the_header():
    assert format_table([]).splitlines()[0].startswith("name")


def test_the_legend_explains_every_column():
    from specexec.bench.report import COLUMNS, LEGEND

    explained = {line.split()[0] for line in LEGEND.splitlines() if line and not line.startswith(" ")}
    for header in COLUMNS:
        if header in ("name", "c", "n"):
            continue
        assert header.split()[0] in explained or header in LEGEND, header
    assert "prefill" in LEGEND and "c=1" in LEGEND, "why tok/s/user can exceed tok/s at c=1"


def test_the_benchmarking_page_shows_the_legend_as_printed():
    from pathlib import Path

    import specexec
    from specexec.bench.report import LEGEND

    page = (Path(specexec.__file__).parent / "docs" / "benchmarking.md").read_text()
    for line in LEGEND.splitlines():
        if not line.startswith("timing:") and not line.startswith(" "):
            assert line in page, line


def test_conversations_get_a_later_turns_ttft_column_and_caching_its_ratio_line():
    from specexec.bench.report import caching_ratios

    def turns(cached: int, ttft_later: float) -> list[RequestRecord]:
        first = RequestRecord("c/turn1", 10, 5, 100.0, 50.0, 10.0)
        second = RequestRecord("c/turn2", 30, 5, 100.0, ttft_later, 10.0, turn=2, num_cached_tokens=cached)
        return [first, second]

    off = summarize("none", 1, turns(0, 40.0), 1.0)
    on = summarize("none+cache", 1, turns(20, 10.0), 0.5)
    assert on["cached_share"] == 0.5 and off["cached_share"] == 0.0
    assert on["ttft_later_turns_ms_p50"] == 10.0
    lines = format_table([off, on]).splitlines()
    assert "ttft 2+ ms" in lines[0] and "cached%" in lines[0]
    assert lines[3].split()[6] == "10" and "50%" in lines[3].split()
    (ratio,) = caching_ratios([off, on])
    assert "TTFT of turns 2+ 0.25x" in ratio and "tok/s 2.00x" in ratio and "cached 50%" in ratio
    single = summarize("none", 1, turns(0, 40.0)[:1], 1.0)
    assert "ttft 2+ ms" not in format_table([single]).splitlines()[0], "only conversations get it"


def test_the_drafted_column_is_the_share_of_decode_steps_that_verified_a_draft():
    """What the draft-length policy did: 3 of 10 steps drafted (one of them 2 deep), another request
    drafted in 1 of its 10; a row without drafts shows none."""
    first = RequestRecord("p0", 10, 11, 100.0, 20.0, 10.0, num_decode_steps=10, num_draft_tokens=4)
    first.proposed_per_position, first.accepted_per_position = [3, 1], [2, 0]
    second = RequestRecord("p1", 10, 11, 100.0, 20.0, 10.0, num_decode_steps=10, num_draft_tokens=1)
    second.proposed_per_position, second.accepted_per_position = [1], [1]
    row = summarize("ngram", 1, [first, second], 1.0)
    assert row["drafted_share"] == 4 / 20
    assert "20%" in format_table([row]).splitlines()[2]
    plain = summarize("none", 1, [RequestRecord("p0", 10, 11, 100.0, 20.0, 10.0, num_decode_steps=10)], 1.0)
    assert plain["drafted_share"] is None
