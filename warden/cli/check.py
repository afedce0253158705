"""`warden check-workload`: run a training command locally and check its preemption contract."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from warden.cli import tables


def register(app: typer.Typer) -> None:
    @app.command("check-workload", context_settings={"allow_interspersed_args": False})
    def check_workload_cmd(
        command: Annotated[
            list[str], typer.Argument(help="The command and its arguments (after --).", show_default=False)
        ],
        grace: Annotated[str, typer.Option("--grace", help="Grace period after SIGTERM.")] = "120s",
        timeout: Annotated[str, typer.Option("--timeout", help="How long to wait for progress reports.")] = "5m",
        json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Run CMD, wait for progress, send SIGTERM; check it saves, exits 0 within the grace,
        and resumes from that checkpoint on a second run. Exit 0 only if it does all of it."""
        from warden.engine.policy import PolicyError, parse_duration
        from warden.workload.check import check_workload

        values = {}
        for name, text in (("--grace", grace), ("--timeout", timeout)):
            try:
                values[name] = parse_duration(text)
            except (ValueError, TypeError, PolicyError) as bad:
                typer.echo(f"error: {name}: {text!r} is not a duration ({bad})", err=True)
                raise typer.Exit(2) from None
        err = Console(stderr=True)
        verdict = check_workload(
            command,
            values["--grace"],
            values["--timeout"],
            say=lambda line: err.print(f"[dim]{line}[/dim]") if not json_out else None,
        )
        if json_out:
            typer.echo(json.dumps(verdict.to_dict(), indent=2))
        else:
            out = tables.console()
            t = Table(tables.fixed("check"), tables.fixed("result"), tables.text("detail"))
            for c in verdict.checks:
                t.add_row(c.name, "[green]pass[/green]" if c.ok else "[red]FAIL[/red]", c.detail)
            tables.show(out, t)
            out.print(
                "[green]the workload honours the preemption contract[/green]"
                if verdict.ok
                else "[red]the workload does not honour the preemption contract[/red]"
            )
        raise typer.Exit(0 if verdict.ok else 1)
