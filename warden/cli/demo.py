"""`warden demo`: run one scheduling pass over the bundled scenario and show the plan."""

from __future__ import annotations

import json
from typing import Any

import typer

from warden.cli import tables
from warden.cli.app import App
from warden.cli.tables import Col
from warden.demo import NOW, demo_snapshot
from warden.engine.durations import span
from warden.engine.plan import Plan
from warden.engine.reasons import virtual_times
from warden.engine.scheduler import schedule

app = App()


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as JSON-ready data, with DESIGN's names."""
    return {
        "now": plan.now,
        "admissions": [
            {
                "id": a.job_id,
                "flavor": a.flavor,
                "borrowing": a.borrowing,
                "placement": [{"node": p.node, "gpus": list(p.gpus)} for p in a.placement],
            }
            for a in plan.admissions
        ],
        "preemptions": [
            {
                "id": p.job_id,
                "for_job": p.for_job,
                "kind": p.kind,
                "grace_s": p.grace,
                "cost_gpu_s": p.cost,
                "lost_work_gpu_s": p.lost_work,
            }
            for p in plan.preemptions
        ],
        "reservations": [
            {"id": r.job_id, "due": r.due, "nodes": list(r.nodes), "waits_for": list(r.waits_for)}
            for r in plan.reservations
        ],
        "pending": [
            {"id": e.job_id, "position": e.position, "reason": e.reason.to_dict(), "sort_key": e.sort_key.to_dict()}
            for e in plan.explanations.values()
        ],
    }


@app.callback(invoke_without_command=True)
def demo(json_out: bool = typer.Option(False, "--json", help="Print the plan as one JSON object.")) -> None:
    """Run one pass of the engine over a full 96-GPU cluster as a tier-1 service arrives."""
    snapshot = demo_snapshot()
    plan = schedule(snapshot, NOW)
    if json_out:
        typer.echo(json.dumps(plan_to_dict(plan), indent=2))
        return
    console = tables.console()
    jobs = {j.id: j for j in snapshot.jobs}
    console.print(
        f"[bold]warden demo[/bold]: {len(snapshot.nodes)} nodes, "
        f"{sum(n.gpus for n in snapshot.nodes)} GPUs, "
        f"{sum(1 for j in snapshot.jobs if j.state.holds_resources)} running jobs, "
        f"{sum(1 for j in snapshot.jobs if j.state.waiting)} waiting; one scheduling pass."
    )
    cells = []
    for p in plan.preemptions:
        v = jobs[p.job_id]
        cells.append(
            [
                p.job_id,
                str(v.tier),
                v.queue,
                p.for_job,
                p.kind,
                span(p.grace),
                f"{p.lost_work / 60:.0f}",
                f"{p.cost / 60:.0f}",
            ]
        )
    tables.titled(
        console, "Preemptions (victims chosen by the work they would lose)", tables.listing(_PREEMPTIONS, cells)
    )
    if plan.admissions:
        cells = [
            [adm.job_id, ", ".join(f"{p.node}{list(p.gpus)}" for p in adm.placement), str(adm.borrowing)]
            for adm in plan.admissions
        ]
        tables.titled(console, "Admissions", tables.listing(_ADMISSIONS, cells))
    at = virtual_times(NOW)  # the demo's clock is virtual: "t=…s (in 9m)"
    cells = []
    for e in sorted(plan.explanations.values(), key=lambda e: e.position):
        j = jobs[e.job_id]
        cells.append([str(e.position), e.job_id, str(j.tier), j.queue, e.reason.code, e.reason.render(at, e.job_id)])
    tables.titled(console, "Why each job is pending", tables.listing(_PENDING, cells))


_PREEMPTIONS = (
    Col("victim"),
    Col("tier", "right"),
    Col("queue"),
    Col("for job"),
    Col("kind"),
    Col("grace", "right"),
    Col("lost work (GPU-min)", "right", gives=1),
    Col("cost (GPU-min)", "right", gives=1),
)
_ADMISSIONS = (Col("job"), Col("placement", gives=1), Col("borrowing"))
_PENDING = (
    Col("#", "right"),
    Col("job"),
    Col("tier", "right"),
    Col("queue"),
    Col("reason"),
    Col("explanation", gives=1),
)
