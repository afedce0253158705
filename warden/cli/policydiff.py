"""`warden policy diff`'s tables, and its `--replay`: the server's exported history simulated
here under the policy in force and under the new one, on the server's nodes (docs/policy.md,
*Before applying*).

The replay reuses the simulator as `warden sim compare` runs it: the same trace and cluster
for both policies, the metrics `warden.sim.metrics.summarize` computes, set side by side
(`warden.sim.experiment.side_by_side`).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from warden.cli import tables
from warden.cli.history import fail, warn
from warden.client import Client
from warden.engine.durations import relative
from warden.engine.model import Node
from warden.engine.policy import PolicyError, format_duration, parse_policy
from warden.sim.experiment import prepare, run_policy, side_by_side
from warden.sim.loaders import TraceError
from warden.sim.metrics import format_gpu_hours, format_percent, format_span
from warden.sim.presets import sim_policy
from warden.sim.simulator import SimulationLoopError

EXIT_LOOP = 3


def replay_history(c: Client, new_source: str, seconds: float) -> dict[str, Any]:
    """The jobs of the last `seconds`, as the server exports them, simulated under its policy
    and under `new_source` on its nodes; the export's warning (durations that rest on an
    assumption) is printed on stderr and kept as `warning`."""
    body, warning = c.export_history(time.time() - seconds, "native")
    warn(warning)
    current = c.policy()
    nodes = tuple(
        Node(n["name"], n["gpus"], n.get("cpu") or 0, n.get("memory") or 0, n["flavor"], n.get("block"))
        for n in c.nodes()
    )
    try:
        before = parse_policy(current["source"], "the server's policy") if current["source"] else None
        if before is None:
            before = parse_policy(current["policy"], "the server's policy")
        after = parse_policy(new_source, "the new policy")
    except PolicyError as err:
        raise fail("; ".join(str(i) for i in err.issues)) from None
    with tempfile.TemporaryDirectory(prefix="warden-replay-") as tmp:
        trace = Path(tmp) / "history.csv"
        trace.write_bytes(body)
        try:
            setup = prepare(trace, format="native", nodes=nodes)
        except (TraceError, ValueError) as err:
            raise fail(f"--replay: the server's export did not load: {err}") from None
    if not setup.trace.jobs:
        raise fail(
            f"--replay: no job submitted in the last {format_duration(seconds)} has run on the server; nothing to replay"
        )
    outcomes = []
    for name, policy in (("current", before), ("new", after)):
        try:
            outcomes.append(run_policy(setup, sim_policy(name, policy)))
        except SimulationLoopError as err:
            Console(stderr=True).print(f"error: {name}: the simulation stopped: {err}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_LOOP) from None
    return {
        "window_s": seconds,
        "jobs": len(setup.trace.jobs),
        "gpus": setup.gpus,
        "policy_version": current.get("version"),
        "warning": warning,
        "rows": side_by_side(outcomes[0].summary, outcomes[1].summary),
        "current": outcomes[0].summary,
        "new": outcomes[1].summary,
    }


# -- tables -----------------------------------------------------------------------------------


def print_diff(file: Path, out: dict[str, Any]) -> None:
    con = tables.console(highlight=False)
    now = float(out["now"])
    settings = out.get("settings") or []
    if settings:
        t = Table("setting", "current", "new", title="settings that differ", title_justify="left", box=box.SIMPLE_HEAD)
        for s in settings:
            t.add_row(s["path"], _setting(s, "before"), _setting(s, "after"))
        tables.show(con, t)
    else:
        con.print(f"{file}: no setting differs from the policy in force")
    for job in out.get("queues_missing") or []:
        con.print(
            f"[bold yellow]warning:[/] job {job['id']} ({job['state']}) is in queue {job['queue']}, which {file} "
            "does not have: `policy apply` refuses it while the job is unfinished",
            soft_wrap=True,
        )
    running = out.get("running") or []
    if running:
        t = Table(
            "job", "queue", "tier", "preemptible from", "preempted now", title="running jobs", title_justify="left"
        )
        t.box = box.SIMPLE_HEAD
        for r in running:
            b, a = r["before"], r["after"]
            t.add_row(
                r["id"],
                r["queue"],
                str(r["tier"]),
                f"{_when(b['preemptible_from'], now)} → {_when(a['preemptible_from'], now)}",
                f"{_yes(b['preempted'])} → {_yes(a['preempted'])}",
            )
        tables.show(con, t)
    pending = out.get("pending") or []
    if pending:
        t = Table("job", "queue", "tier", "position", "next pass", title="waiting jobs", title_justify="left")
        t.box = box.SIMPLE_HEAD
        for p in pending:
            b, a = p["before"], p["after"]
            moved = p["moved"]
            arrow = "" if not moved else f" ({'↑' if moved > 0 else '↓'}{abs(moved)})"
            t.add_row(
                p["id"],
                p["queue"],
                str(p["tier"]),
                f"{b['position']} → {a['position']}{arrow}",
                _outcome(a) if _outcome(a) == _outcome(b) else f"{_outcome(b)} → {_outcome(a)}",
            )
        tables.show(con, t)
        for p in pending:
            b, a = p["before"], p["after"]
            if p["reason_changed"] and a["reason"] is not None:
                con.print(f"job {p['id']}: {a['reason']['message']}", soft_wrap=True)
    same = out.get("unchanged") or {}
    con.print(
        f"unchanged: {same.get('running', 0)} running job(s), {same.get('pending', 0)} waiting job(s)",
    )
    for w in out.get("warnings") or []:
        con.print(f"[bold yellow]warning:[/] {file}: {w['message']}", soft_wrap=True)
    if "replay" in out:
        _print_replay(con, out["replay"])


def _print_replay(con: Console, replay: dict[str, Any]) -> None:
    t = Table(
        "scope",
        "metric",
        "current",
        "new",
        "difference",
        title=f"replay: {replay['jobs']} jobs of the last {format_duration(replay['window_s'])} on {replay['gpus']} GPUs",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for column in t.columns[2:]:
        column.justify = "right"
    last = None
    for r in replay["rows"]:
        scope = r["scope"] if not r["name"] else f"{r['scope']} {r['name']}"
        t.add_row(
            scope if scope != last else "",
            _METRIC_NAMES.get(r["metric"], r["metric"]),
            _value(r["kind"], r["before"]),
            _value(r["kind"], r["after"]),
            _difference(r["kind"], r["difference"]),
        )
        last = scope
    tables.show(con, t)
    for side in ("current", "new"):
        skipped = replay[side].get("skipped") or {}
        if skipped:
            con.print(f"{side}: trace jobs left out: " + ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())))


_METRIC_NAMES = {
    "finished": "finished jobs",
    "avg_wait_s": "avg wait",
    "p50_wait_s": "p50 wait",
    "p95_wait_s": "p95 wait",
    "max_wait_s": "max wait",
    "max_wait_least_served_queue_s": "worst queue max wait",
    "starvation_breaches": "breaches",
    "preemptions_per_hour": "preemptions/h",
    "lost_gpu_hours": "lost GPU-h",
    "lost_work_per_preemption_s": "lost per preemption",
    "owed_gpu_hours": "owed GPU-h",
    "delivered_gpu_hours": "delivered GPU-h",
    "delivered_over_owed": "delivered/owed",
}


def _value(kind: str, v: Any) -> str:
    if v is None:
        return "—"
    if kind == "s":
        return format_span(v)
    if kind == "fraction":
        return format_percent(v)
    if kind == "gpu_hours":
        return format_gpu_hours(v)
    if kind == "number":
        return f"{float(v):.3g}"
    return str(v)


def _difference(kind: str, d: Any) -> str:
    if d is None:
        return "—"
    if d == 0:
        return "0"
    sign = "+" if d > 0 else "-"
    if kind == "s":
        return sign + format_span(abs(d))
    if kind == "fraction":
        return f"{sign}{abs(100 * d):.1f} pt"
    return sign + _value(kind, abs(d))


def _setting(s: dict[str, Any], side: str) -> str:
    return "(none)" if side not in s else "—" if s[side] is None else str(s[side])


def _when(t: float | None, now: float) -> str:
    """When a job becomes preemptible: never, now (already), or "in 9m"."""
    return "never" if t is None else relative(max(t, now), now)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _outcome(side: dict[str, Any]) -> str:
    if side["starts"]:
        return "starts"
    return side["reason"]["code"] if side["reason"] else "—"
