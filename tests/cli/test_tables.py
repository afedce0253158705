"""`warden.cli.tables`: listings and tables of records laid out for 80 columns, whole in a pipe,
and never a cell cut to "…"."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from warden.cli import tables
from warden.cli.jobs import QUEUE_COLUMNS

# ID NAME USER QUEUE TIER STATE GPUS WAIT POS START ELAPSED LEASE-END NODES REASON, as `warden
# queue` fills them.
JOBS = [
    [
        "101",
        "llama-pretrain",
        "alice",
        "language",
        "2",
        "RUNNING",
        "16",
        "30s",
        "",
        "",
        "2h5m",
        "in 1h55m",
        "n1,n2",
        "",
    ],
    [
        "117",
        "bert-finetune",
        "bob",
        "vision",
        "3",
        "PENDING",
        "2",
        "12m34s",
        "1",
        "in 1h",
        "",
        "",
        "",
        "InsufficientCapacity",
    ],
    [
        "118",
        "eval-harness",
        "carol",
        "language",
        "3",
        "PENDING",
        "2",
        "9m",
        "2",
        "?",
        "",
        "",
        "",
        "PreemptionWouldNotPay",
    ],
]


def render(*renderables: object, width: int = 80) -> str:
    con = Console(file=io.StringIO(), width=width, record=True)
    tables.show(con, *renderables)
    return con.export_text()


def lines_fit(text: str, width: int = 80) -> bool:
    return all(len(line) <= width for line in text.splitlines())


@pytest.fixture
def columns_80(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


def test_the_width_is_columns_else_none_for_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert tables.width() == 80 and tables.console().width == 80
    monkeypatch.delenv("COLUMNS")
    assert tables.width() is None  # pytest's stdout is not a terminal
    assert tables.console().width == tables.WHOLE


def test_the_default_listing_fits_80_columns_with_every_cell_whole(columns_80: None) -> None:
    text = render(tables.listing(QUEUE_COLUMNS, JOBS))
    assert lines_fit(text) and "…" not in text, text
    header = text.splitlines()[0].split()
    assert header == ["ID", "NAME", "QUEUE", "TIER", "STATE", "GPUS", "START", "REASON"]
    for job in JOBS:
        row = next(line for line in text.splitlines() if line.startswith(job[0] + " "))
        for i, cell in enumerate(job):
            if not QUEUE_COLUMNS[i].wide:
                assert cell in row, (cell, text)


def test_wide_adds_the_other_columns(columns_80: None) -> None:
    text = render(tables.listing(QUEUE_COLUMNS, JOBS, wide=True))
    assert text.splitlines()[0].split() == [c.header for c in QUEUE_COLUMNS]
    assert "12m34s" in text and "carol" in text and "…" not in text


def test_a_long_name_gives_way_before_the_reason(columns_80: None) -> None:
    waits = [
        "119",
        "a-rather-long-job-name",
        "dan",
        "vision",
        "1",
        "AWAITING_APPROVAL",
        "2",
        "1m",
        "3",
        "?",
        "",
        "",
        "",
    ]
    text = render(tables.listing(QUEUE_COLUMNS, [JOBS[1], [*waits, "AwaitingApproval"]]))
    assert lines_fit(text) and "…" not in text, text
    assert "InsufficientCapacity" in text and "AwaitingApproval" in text  # the reasons, whole
    assert "a-rather-long-job-name" not in text  # the name wrapped instead
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("119 ")))
    assert "".join(line.split()[-1 if i else 1] for i, line in enumerate(lines[start:])) == "a-rather-long-job-name"


def test_text_wraps_at_words_and_a_table_too_wide_for_its_cells_is_not_cut(columns_80: None) -> None:
    reason = "preempted for job 121 (language, tier 2): freeing 4 GPUs costs the least lost work " * 2
    cols = (tables.Col("TIME"), tables.Col("REASON", gives=1))
    text = render(tables.listing(cols, [["2026-12-03 14:41:45", reason.strip()]]))
    assert lines_fit(text) and " ".join(text.split()).endswith(reason.strip()), text
    unbreakable = [["x" * 60, "y" * 60]]
    wide = render(tables.listing((tables.Col("A"), tables.Col("B")), unbreakable))
    assert "x" * 60 in wide and "y" * 60 in wide and "…" not in wide


def summaries(n: int) -> Table:
    """A table of records like `sim compare`'s: one row a policy."""
    t = Table("policy", *(f"metric {k}" for k in range(12)))
    for p in range(n):
        t.add_row(f"policy_{p}", *(f"{p}.{k}%" for k in range(12)))
    return t


def test_records_that_do_not_fit_turn_on_their_side_and_split(columns_80: None) -> None:
    parts = tables.records(summaries(6), {"metric 0": "the first metric, in full"}, label="metric")
    assert len(parts) > 1
    text = render(*parts)
    assert lines_fit(text) and "…" not in text, text
    assert "the first metric, in full" in text and "metric 11" in text
    for p in range(6):
        assert text.count(f"policy_{p}") == 1
        for k in range(12):
            assert f"{p}.{k}%" in text


def test_records_that_fit_or_go_to_a_pipe_stay_one_row_a_record(monkeypatch: pytest.MonkeyPatch) -> None:
    table = summaries(6)
    monkeypatch.setenv("COLUMNS", "300")
    assert tables.records(table) == [table]
    monkeypatch.delenv("COLUMNS")
    [whole] = tables.records(table)
    assert whole is table
    text = render(whole, width=tables.WHOLE)
    row = next(line for line in text.splitlines() if "policy_5" in line)
    assert all(f"5.{k}%" in row for k in range(12))


def test_a_wide_listing_past_the_width_keeps_every_word_of_its_headers_and_cells_whole(columns_80: None) -> None:
    """`warden queues --wide` at 80 columns: its text columns cannot give enough, so the table
    runs past the width, each column as wide as its longest word; none is squeezed ("NOMINA L")."""
    from warden.cli.jobs import QUEUES_COLUMNS

    row = ["default", "cluster", "1", "none", "any", "all", "0", "0", "0", "0.2742", "0.00", "0.00"]
    text = render(tables.listing(QUEUES_COLUMNS, [["cluster", "", *row[2:]], row], wide=True))
    words = text.split()
    assert {"NOMINAL", "DELIVERED", "GPU-h", "FAIR-SHARE", "0.2742"} <= set(words), text
    assert all(line.split()[-1] == "0.00" for line in text.splitlines()[-2:]), text
