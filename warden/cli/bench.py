"""`warden bench`: measure warden's components on this machine.

`warden bench engine` times one full scheduling pass over a seeded synthetic cluster, so an
operator can see before a rollout how long a pass takes at their cluster's size.
"""

from __future__ import annotations

import json

import typer
from rich.table import Table

from warden.cli import tables
from warden.cli.app import App

app = App(no_args_is_help=True)


@app.callback()
def bench() -> None:
    """Measure warden's components on this machine."""


@app.command("engine")
def engine(
    nodes: int = typer.Option(100, "--nodes", min=1, help="Nodes in the synthetic cluster."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, help="GPUs per node."),
    pending: int = typer.Option(1000, "--pending", min=0, help="Waiting jobs."),
    running: int = typer.Option(
        500, "--running", min=0, help="Running jobs (at most; placement stops when the cluster is full)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the synthetic cluster (same seed, same input)."),
    repeat: int = typer.Option(5, "--repeat", min=1, help="Timed passes after one warm-up pass."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """Time one full scheduling pass (median of --repeat) over a seeded synthetic cluster."""
    from warden.bench.engine import run_engine_bench

    result = run_engine_bench(nodes, gpus_per_node, pending, running, seed=seed, repeat=repeat)
    if json_out:
        typer.echo(json.dumps(result))
        return
    table = Table(title=f"warden engine: one scheduling pass (median of {repeat})")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("cluster", f"{nodes} nodes × {gpus_per_node} GPUs = {result['gpus']} GPUs"),
        ("running (placed / asked)", f"{result['running_placed']} / {running}"),
        ("GPUs busy", str(result["gpus_busy"])),
        ("pending", str(pending)),
        ("pass median", f"{result['pass_ms_median']:.1f} ms"),
        ("pass min", f"{result['pass_ms_min']:.1f} ms"),
        ("all passes", ", ".join(f"{t:.1f}" for t in result["pass_ms_all"]) + " ms"),
        ("admissions", str(result["admissions"])),
        ("admissions / s", str(result["admissions_per_s"])),
        ("preemptions", str(result["preemptions"])),
        ("reservations", str(result["reservations"])),
        ("explanations", str(result["explanations"])),
        ("deterministic", str(result["deterministic"])),
        ("seed", str(seed)),
        ("python", str(result["python"])),
    ]
    for name, value in rows:
        table.add_row(name, value)
    tables.show(tables.console(), table)
