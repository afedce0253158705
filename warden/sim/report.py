"""The simulator's HTML report: one self-contained page per `warden sim run/compare`.

The page must open anywhere, offline, attached to an issue or an e-mail, so it carries no
external CSS, JavaScript or fonts: plots are SVG (text drawn as paths) embedded as base64 `data:`
images — each image is its own SVG document, so the element ids matplotlib writes cannot
collide between plots. Plots use matplotlib's object-oriented `Figure` API without pyplot, so
no GUI backend is touched and no global figure registry can leak memory. Every piece of text
that comes from a run (policy, trace, queue names) is HTML-escaped, and `$` is escaped for
matplotlib so a name is never read as mathtext.

Beside `index.html` goes `summary.json`: the `summarize` dict of the one run, or the list of
them when comparing.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator, PercentFormatter
from matplotlib.typing import RcKeyType

from warden.engine.durations import span
from warden.sim.metrics import (
    TABLE_COLUMNS,
    format_gpu_hours,
    format_percent,
    format_span,
    natural_key,
    summarize,
    table_cells,
    timeseries,
)
from warden.sim.records import SimRun

HOUR = 3600.0
SERIES_POINTS = 300
"""Bins of the over-time plots: fine enough to see a day's pattern in a month-long trace."""

PLOT_SECTIONS: tuple[tuple[str, str], ...] = (
    ("waits", "Wait time by tier"),
    ("utilization", "Utilization over time"),
    ("queues", "Owed vs delivered GPU-hours per queue"),
    ("preemptions", "Preemptions and lost work over time"),
)
"""(section id, heading) of the four plots, in page order."""

_RC: dict[RcKeyType, Any] = {"svg.hashsalt": "warden", "svg.fonttype": "path", "font.size": 9.0}
"""Deterministic SVG ids (reports diff cleanly) and glyphs as paths (no font needed to view)."""

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:1200px;
padding:0 1rem;color:#222;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0}
th,td{padding:.25rem .6rem;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{background:#f5f5f5}td:first-child,th:first-child{text-align:left}
dl{display:grid;grid-template-columns:max-content auto;gap:.2rem 1rem}dt{font-weight:600}dd{margin:0}
figure{margin:1rem 0}figure img{max-width:100%;height:auto}figcaption{font-size:.85rem;color:#555}
.note{background:#f8f8f2;border-left:3px solid #bbb;padding:.5rem 1rem;font-size:.9rem}
.warning{background:#fff4e0;border-left:3px solid #e69500;padding:.5rem 1rem;font-size:.9rem}
"""


# ---------------------------------------------------------------------------- entry point


def write_report(directory: Path, runs: list[SimRun], summaries: list[dict[str, Any]] | None = None) -> Path:
    """Write `index.html` and `summary.json` into `directory` (created); return the HTML path.

    `summaries` are the runs' `summarize` dicts when the caller already has them (they are
    computed otherwise); they must be in the order of `runs`.
    """
    if not runs:
        raise ValueError("write_report needs at least one run")
    if summaries is None:
        summaries = [summarize(r) for r in runs]
    if len(summaries) != len(runs):
        raise ValueError(f"summaries: {len(summaries)} given for {len(runs)} runs")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    document = summaries[0] if len(summaries) == 1 else summaries
    (directory / "summary.json").write_text(json.dumps(document, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    path = directory / "index.html"
    path.write_text(render_html(runs, summaries), encoding="utf-8")
    return path


def render_html(runs: Sequence[SimRun], summaries: Sequence[dict[str, Any]]) -> str:
    """The whole page as one string."""
    labels = run_labels(runs)
    series = [timeseries(r, points=SERIES_POINTS) for r in runs]
    with matplotlib.rc_context(_RC):
        images = {
            "waits": _svg_data_uri(_wait_cdf_figure(labels, series)),
            "utilization": _svg_data_uri(_utilization_figure(labels, series)),
            "queues": _svg_data_uri(_queue_figure(labels, summaries)),
            "preemptions": _svg_data_uri(_preemption_figure(labels, series)),
        }
    body = [
        f"<h1>{_e('warden simulation report')}</h1>",
        _run_section(runs, labels),
        _how_to_read_section(),
        _summary_section(labels, summaries),
    ]
    for section_id, heading in PLOT_SECTIONS:
        body.append(_plot_section(section_id, heading, images[section_id]))
        if section_id == "queues":
            body.append(_queue_table_section(labels, summaries))
    title = "warden simulation — " + ", ".join(dict.fromkeys(r.trace for r in runs))
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def run_labels(runs: Sequence[SimRun]) -> list[str]:
    """One legend label per run: its policy, made unique by seed (then position) if it repeats."""
    labels = [r.policy for r in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{r.policy} (seed {r.seed})" for r in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{label} #{i + 1}" for i, label in enumerate(labels)]
    return labels


# ---------------------------------------------------------------------------- HTML sections


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _run_section(runs: Sequence[SimRun], labels: Sequence[str]) -> str:
    def joined(values: Sequence[Any]) -> str:
        return ", ".join(str(v) for v in dict.fromkeys(values))

    items = [
        ("trace", joined([r.trace for r in runs])),
        ("seed", joined([r.seed for r in runs])),
        ("GPUs", joined([r.gpus for r in runs])),
        ("jobs", joined([len(r.jobs) for r in runs])),
        ("policies", ", ".join(labels)),
    ]
    dl = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items)
    return f'<section id="run"><h2>Run</h2><dl>{dl}</dl></section>'


_HOW_TO_READ = (
    "Each row of the summary is one policy replaying the same trace on the same cluster; "
    "the engine is the same, only the policy differs.",
    "Wait is the time a job spent pending or requeued, over all its attempts; p50/p95 use numpy's "
    "linear interpolation. JCT is submit to finish, over finished jobs only.",
    "Utilization is GPU-time held by jobs over GPU-time available; goodput is the part of held "
    "GPU-time that became surviving progress (not startup, checkpoint writes, lost or stranded time).",
    "Lost GPU-hours are progress thrown away by preemptions plus GPUs held without progress "
    "(stranded gang members): the cost of the priority scheme. η is the same ratio per finished "
    "job; its 5th percentile shows the unluckiest jobs.",
    "Owed GPU-hours divide the cluster at every instant among the queues with pending or running "
    "work, by their entitlement weights, each capped at what it asks for (weighted max-min "
    "fairness); delivered GPU-hours are what the queue's jobs actually held. Delivered above owed "
    "means the queue borrowed capacity others left idle; below means it was under-served.",
    "The least-served queue is the one with the longest single wait; a starvation breach is a "
    "job that waited at least its queue's configured maximum wait.",
    "A dash (—) marks a value that is undefined for the run, e.g. η when no job finished.",
)


def _how_to_read_section() -> str:
    items = "".join(f"<li>{_e(s)}</li>" for s in _HOW_TO_READ)
    return f'<section id="how-to-read"><h2>How to read this</h2><div class="note"><ul>{items}</ul></div></section>'


def _summary_section(labels: Sequence[str], summaries: Sequence[dict[str, Any]]) -> str:
    headers = [h for h, _, _ in TABLE_COLUMNS]
    rows = []
    for label, s in zip(labels, summaries):
        cells = table_cells(s)
        cells[0] = label
        rows.append(cells)
    warnings = "".join(
        f'<p class="warning">{_e(label)}: {_e(w)}</p>'
        for label, s in zip(labels, summaries)
        for w in (*(s.get("policy_warnings") or ()), s.get("preemption_warning"))
        if w
    )
    return f'<section id="summary"><h2>Summary</h2>{_table(headers, rows)}{warnings}</section>'


def _queue_table_section(labels: Sequence[str], summaries: Sequence[dict[str, Any]]) -> str:
    headers = [
        "policy",
        "queue",
        "jobs",
        "p50 wait",
        "p95 wait",
        "max wait",
        "owed GPU-h",
        "delivered GPU-h",
        "delivered / owed",
    ]
    rows = []
    for label, s in zip(labels, summaries):
        for queue, q in s.get("per_queue", {}).items():
            rows.append(
                [
                    label,
                    queue,
                    str(q["jobs"]),
                    format_span(q["p50_wait_s"]),
                    format_span(q["p95_wait_s"]),
                    format_span(q["max_wait_s"]),
                    format_gpu_hours(q["owed_gpu_hours"]),
                    format_gpu_hours(q["delivered_gpu_hours"]),
                    format_percent(q["delivered_over_owed"]),
                ]
            )
    return f'<section id="queue-table"><h2>Per queue</h2>{_table(headers, rows)}</section>'


def _plot_section(section_id: str, heading: str, image: str) -> str:
    return (
        f'<section id="{_e(section_id)}"><h2>{_e(heading)}</h2><figure>'
        f'<img alt="{_e(heading)}" src="{image}"><figcaption>{_e(_CAPTIONS[section_id])}</figcaption>'
        "</figure></section>"
    )


_CAPTIONS = {
    "waits": "Fraction of each tier's jobs that waited at most x (all jobs, finished or not); "
    "further left and higher is better. The x axis is linear below one minute, logarithmic above.",
    "utilization": "Busy GPUs / cluster GPUs, averaged exactly over each bin, against hours since the first arrival.",
    "queues": "Hatched: owed (entitled share of the cluster while the queue had work); solid: delivered.",
    "preemptions": "Preemptions per hour and GPU-hours of work lost per hour, counted when the "
    "preempted attempt handed its GPUs back.",
}


# ---------------------------------------------------------------------------- plots


def _svg_data_uri(figure: Figure) -> str:
    """Render to SVG and release the figure's artists (there is no pyplot registry to close)."""
    buf = io.BytesIO()
    figure.savefig(buf, format="svg", metadata={"Date": None})
    figure.clear()
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _mpl(text: str) -> str:
    """Text for matplotlib: a `$` would start mathtext."""
    return text.replace("$", r"\$")


def _new_figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def _no_data(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="#888")


def _grid(count: int) -> tuple[int, int]:
    cols = min(3, max(count, 1))
    return math.ceil(max(count, 1) / cols), cols


_WAIT_TICKS = (0.0, 60.0, 600.0, HOUR, 6 * HOUR, 24 * HOUR, 7 * 24 * HOUR, 30 * 24 * HOUR)
"""Wait ticks people think in: none, a minute, ten minutes, an hour, six hours, a day, a week, a month."""


def _tick(seconds: float) -> str:
    """A round duration in the short form: 1m, 10m, 1h, 1d."""
    return "0" if seconds <= 0 else span(seconds)


def _duration_axis(ax: Axes, longest: float) -> None:
    """Symlog seconds (linear up to a minute, so zero waits show) with ticks at human durations."""
    ax.set_xscale("symlog", linthresh=60.0)
    ax.set_xlim(0.0, max(longest, 60.0) * 1.2)
    ax.set_xticks([t for t in _WAIT_TICKS if t <= max(longest, 60.0) * 1.2])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: _tick(x)))
    ax.xaxis.set_minor_locator(NullLocator())


def _wait_cdf_figure(labels: Sequence[str], series: Sequence[dict[str, Any]]) -> Figure:
    """Small multiples, one panel per policy, one line per tier (same colour per tier throughout)."""
    rows, cols = _grid(len(labels))
    fig = _new_figure(4.2 * cols, 3.0 * rows)
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    tiers = sorted({t for s in series for t in s["wait_cdf"]}, key=int)
    longest = max((max(c["wait_s"], default=0.0) for s in series for c in s["wait_cdf"].values()), default=0.0)
    colours = {t: f"C{i}" for i, t in enumerate(tiers)}
    for i, ax in enumerate(axes.flat):
        if i >= len(labels):
            ax.set_visible(False)
            continue
        cdf = series[i]["wait_cdf"]
        for tier in sorted(cdf, key=int):
            ax.step(cdf[tier]["wait_s"], cdf[tier]["fraction"], where="post", color=colours[tier], label=f"tier {tier}")
        if not cdf:
            _no_data(ax)
        else:
            _duration_axis(ax, longest)
            ax.legend(loc="lower right", fontsize=8)
        ax.set_title(_mpl(labels[i]))
        ax.set_xlabel("wait")
        ax.set_ylim(0, 1.02)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.grid(alpha=0.3)
    return fig


def _hours_axis(edges: Sequence[float]) -> list[float]:
    return [(e - edges[0]) / HOUR for e in edges]


def _step(ax: Axes, edges: Sequence[float], values: Sequence[float], label: str) -> None:
    """A per-bin series drawn as flat steps over its bins."""
    ax.stairs(values, _hours_axis(edges), label=_mpl(label), linewidth=1.2)


def _utilization_figure(labels: Sequence[str], series: Sequence[dict[str, Any]]) -> Figure:
    fig = _new_figure(10.0, 3.4)
    ax = fig.subplots()
    drawn = False
    for label, s in zip(labels, series):
        if s["utilization"]:
            _step(ax, s["edges_s"], s["utilization"], label)
            drawn = True
    if drawn:
        fig.legend(loc="outside upper center", ncols=min(len(labels), 6), fontsize=8)
    else:
        _no_data(ax)
    ax.set_ylim(0, 1.05)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("hours since first arrival")
    ax.set_ylabel("utilization")
    ax.grid(alpha=0.3)
    return fig


def _queue_figure(labels: Sequence[str], summaries: Sequence[dict[str, Any]]) -> Figure:
    """Small multiples per policy: owed (hatched) and delivered (solid) bars side by side per queue."""
    queues = sorted({q for s in summaries for q in s.get("per_queue", {})}, key=natural_key)
    rows, cols = _grid(len(labels))
    width = max(4.2, min(14.0, 0.45 * len(queues) + 1.5))
    cols = 1 if width > 7 else cols
    rows = math.ceil(len(labels) / cols)
    fig = _new_figure(width * cols, 3.2 * rows)
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    x = list(range(len(queues)))
    for i, ax in enumerate(axes.flat):
        if i >= len(labels):
            ax.set_visible(False)
            continue
        per_queue = summaries[i].get("per_queue", {})
        owed = [per_queue.get(q, {}).get("owed_gpu_hours") or 0.0 for q in queues]
        delivered = [per_queue.get(q, {}).get("delivered_gpu_hours") or 0.0 for q in queues]
        ax.bar([v - 0.2 for v in x], owed, width=0.4, label="owed", color="none", edgecolor="C0", hatch="///")
        ax.bar([v + 0.2 for v in x], delivered, width=0.4, label="delivered", color="C0")
        ax.set_xticks(
            x,
            [_mpl(q) for q in queues],
            rotation=45 if len(queues) > 6 else 0,
            ha="right" if len(queues) > 6 else "center",
        )
        ax.set_title(_mpl(labels[i]))
        ax.set_ylabel("GPU-hours")
        ax.grid(axis="y", alpha=0.3)
        if queues:
            ax.legend(fontsize=8)
        else:
            _no_data(ax)
    return fig


def _preemption_figure(labels: Sequence[str], series: Sequence[dict[str, Any]]) -> Figure:
    """Rates per hour rather than counts per bin, so runs of different lengths compare."""
    fig = _new_figure(10.0, 5.0)
    top, bottom = fig.subplots(2, 1, sharex=True)
    drawn = False
    for label, s in zip(labels, series):
        if not s["preemptions"]:
            continue
        bin_h = s["bin_s"] / HOUR
        _step(top, s["edges_s"], [p / bin_h for p in s["preemptions"]], label)
        _step(bottom, s["edges_s"], [x / bin_h for x in s["lost_gpu_hours"]], label)
        drawn = True
    if drawn:
        fig.legend(*top.get_legend_handles_labels(), loc="outside upper center", ncols=min(len(labels), 6), fontsize=8)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if not drawn:
            _no_data(ax)
    top.set_ylabel("preemptions / hour")
    bottom.set_ylabel("lost GPU-hours / hour")
    bottom.set_xlabel("hours since first arrival")
    return fig
