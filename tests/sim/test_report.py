"""The simulator's HTML report (warden.sim.report): self-contained, escaped, with every section.

The page is parsed with the standard library's HTMLParser, so the checks are about the document
a browser would see, not about substrings of the source.
"""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from warden.sim.metrics import preemption_spread, summarize
from warden.sim.records import SimAttempt, SimJob, SimRun
from warden.sim.report import PLOT_SECTIONS, run_labels, write_report

H = 3600.0
NASTY = 'fifo<script>alert("x")</script>&$y$'
"""A policy name that must come out as text, never as markup."""


class Page(HTMLParser):
    """Collects what the assertions need: section ids, images, links, text, table cells."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[str] = []
        self.images: list[tuple[str, str]] = []
        """(enclosing section id, src) of every <img>."""
        self.inline_svgs = 0
        self.references: list[str] = []
        """Every src and href value."""
        self.tags: list[str] = []
        self.text: list[str] = []
        self.cells: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "section":
            self.sections.append(a.get("id") or "")
        if tag == "img":
            self.images.append((self.sections[-1] if self.sections else "", a.get("src") or ""))
        if tag == "svg":
            self.inline_svgs += 1
        for name in ("src", "href"):
            if a.get(name):
                self.references.append(a[name] or "")
        if tag in ("td", "th"):
            self._in_cell = True
            self.cells.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th"):
            self._in_cell = False

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_cell:
            self.cells[-1] += data


def attempt(
    number: int, admitted: float, ended: float, gpus: int, lost: float = 0.0, preempted: bool = False
) -> SimAttempt:
    return SimAttempt(number, admitted, ended, gpus, 0.0, 0.0, ended - admitted - lost, lost, 0.0, preempted)


def two_runs() -> list[SimRun]:
    """The same small trace under two policies: one preempts and requeues, the other queues."""

    def run(policy: str, preempting: bool) -> SimRun:
        if preempting:
            b = SimJob("b", "team<b>", 1, "", 600, 8, 3000, 3600, 0, (attempt(1, 600, 3600, 8),))
            a = SimJob(
                "a",
                "team-a",
                3,
                "",
                0,
                8,
                3600,
                6600,
                3000,
                (attempt(1, 0, 600, 8, lost=300, preempted=True), attempt(2, 3600, 6600, 8)),
            )
        else:
            a = SimJob("a", "team-a", 3, "", 0, 8, 3600, 3600, 0, (attempt(1, 0, 3600, 8),))
            b = SimJob("b", "team<b>", 1, "", 600, 8, 3000, 6600, 3000, (attempt(1, 3600, 6600, 8),))
        return SimRun(
            policy,
            "philly<&>.csv",
            42,
            8,
            (a, b),
            0.0,
            6600.0,
            entitlement={"team-a": 0.5, "team<b>": 0.5},
            max_wait={"team-a": 600.0},
            wall_s=0.01,
            passes=5,
        )

    return [run("governed", True), run(NASTY, False)]


def read_page(path: Path) -> tuple[str, Page]:
    source = path.read_text(encoding="utf-8")
    page = Page()
    page.feed(source)
    page.close()
    return source, page


@pytest.fixture
def report(tmp_path: Path) -> tuple[Path, list[SimRun], list[dict[str, Any]]]:
    runs = two_runs()
    summaries = [summarize(r) for r in runs]
    path = write_report(tmp_path / "out" / "report", runs, summaries)
    return path, runs, summaries


def test_report_writes_html_and_summary_json_beside_it(report: tuple[Path, list[SimRun], list[dict]]) -> None:
    path, _, summaries = report
    assert path.name == "index.html" and path.is_file()
    loaded = json.loads((path.parent / "summary.json").read_text(encoding="utf-8"))
    assert loaded == summaries
    assert [s["policy"] for s in loaded] == ["governed", NASTY]


def test_report_has_every_section_and_one_embedded_svg_per_plot(report: tuple[Path, list, list]) -> None:
    path, _, _ = report
    _, page = read_page(path)
    for section in ("run", "how-to-read", "summary", "queue-table"):
        assert section in page.sections
    plot_ids = [sid for sid, _ in PLOT_SECTIONS]
    assert set(plot_ids) <= set(page.sections)
    assert [sid for sid, _ in page.images] == plot_ids  # exactly one image per plot, each in its section
    for _, src in page.images:
        prefix = "data:image/svg+xml;base64,"
        assert src.startswith(prefix)
        svg = base64.b64decode(src[len(prefix) :]).decode("utf-8")
        assert "<svg" in svg and "</svg>" in svg
    assert page.inline_svgs == 0


def test_report_is_self_contained(report: tuple[Path, list, list]) -> None:
    path, _, _ = report
    _, page = read_page(path)
    assert page.references  # the images
    for ref in page.references:
        assert not ref.lower().startswith(("http://", "https://", "//")), ref
        assert ref.startswith("data:"), ref
    assert "script" not in page.tags and "link" not in page.tags


def test_report_escapes_names_and_shows_the_run(report: tuple[Path, list, list]) -> None:
    path, _runs, _ = report
    source, page = read_page(path)
    assert "<script>" not in source  # the policy name arrived as text
    assert "fifo&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;$y$" in source
    text = " ".join(page.text)
    assert NASTY in text and "governed" in text
    assert "philly<&>.csv" in text and "42" in text
    assert "team<b>" in page.cells
    assert "How to read this" in text


def test_report_summary_table_has_one_row_per_run_in_human_units(report: tuple[Path, list, list]) -> None:
    path, _, summaries = report
    _, page = read_page(path)
    assert page.cells.count("governed") >= 2  # summary row and per-queue rows
    assert NASTY in page.cells
    # governed: a waited 3000 s after its preemption; makespan 6600 s
    assert "1h50m" in page.cells
    assert summaries[0]["preemptions"] == 1 and summaries[1]["preemptions"] == 0


def test_report_shows_the_preemption_warning_of_a_run(tmp_path: Path) -> None:
    runs = two_runs()
    summaries = [{**summarize(r), **preemption_spread(r, limit=0)} for r in runs]
    path = write_report(tmp_path, runs, summaries)
    source, page = read_page(path)
    assert summaries[0]["preemption_warning"] and summaries[1]["preemption_warning"] is None
    assert 'class="warning"' in source and source.count('class="warning"') == 1
    assert "job a was preempted 1 times" in " ".join(page.text)
    assert "0.5 / 0.95 / 1!" in page.cells  # a preempted once, b never: over the limit of 0
    loaded = json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    assert loaded[0]["preemptions_per_job"]["worst_job"] == "a"


def test_single_run_summary_json_is_one_object(tmp_path: Path) -> None:
    run = two_runs()[0]
    path = write_report(tmp_path, [run])
    loaded = json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    assert loaded == summarize(run)
    _, page = read_page(path)
    assert len(page.images) == len(PLOT_SECTIONS)


def test_report_of_a_run_without_jobs_still_renders(tmp_path: Path) -> None:
    empty = SimRun("governed", "empty.csv", 0, 8, (), 0.0, 0.0)
    path = write_report(tmp_path, [empty])
    _, page = read_page(path)
    assert len(page.images) == len(PLOT_SECTIONS)
    assert json.loads((tmp_path / "summary.json").read_text())["jobs"] == 0


def test_report_rejects_mismatched_summaries(tmp_path: Path) -> None:
    runs = two_runs()
    with pytest.raises(ValueError, match="summaries"):
        write_report(tmp_path, runs, [summarize(runs[0])])
    assert not (tmp_path / "index.html").exists()


def test_repeated_policies_get_distinct_labels() -> None:
    runs = two_runs()
    same = [runs[0], runs[0]]
    assert len(set(run_labels(same))) == 2
    assert run_labels(runs) == ["governed", NASTY]
