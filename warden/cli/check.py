"""`warden check-workload`: run a training command locally and check its preemption contract."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from warden.cli import tables
from warden.cli.app import AfterDashes, duration, fail

MAX_SECONDS = 24 * 3600.0
"""No wait of the check is longer than a day."""


def register(app: typer.Typer) -> None:
    @app.command("check-workload", cls=AfterDashes)
    def check_workload_cmd(
        command: Annotated[
            list[str], typer.Argument(help="The command and its arguments (after --).", show_default=False)
        ],
        grace: Annotated[str, typer.Option("--grace", help="Grace period after SIGTERM.")] = "120s",
        timeout: Annotated[
            str, typer.Option("--timeout", help="How long each run may show nothing observable before it fails.")
        ] = "60s",
        warmup: Annotated[
            str | None,
            typer.Option(
                "--warmup",
                help="SIGTERM after this long instead of at the first sign of progress.",
                show_default=False,
            ),
        ] = None,
        checkpoint: Annotated[
            str | None,
            typer.Option(
                "--checkpoint",
                help="Where the job saves, a directory, file or glob (default: $WARDEN_CHECKPOINT_DIR, "
                "a fresh directory).",
                show_default=False,
            ),
        ] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Run CMD, wait for progress, send SIGTERM; check it saves atomically, exits 0 within
        the grace, and resumes from that checkpoint on a second run. With or without warden's
        SDK: what the SDK does not report is watched from outside. Exit 0 only if it does all of it;
        then it says the command may be submitted with --saves-on-sigterm."""
        from rich import box
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        from warden.engine.durations import format_duration
        from warden.workload.check import check_workload

        values: dict[str, float | None] = {}
        for name, text, least in (("--grace", grace, 0.0), ("--timeout", timeout, 1.0), ("--warmup", warmup, 0.0)):
            if text is None:
                values[name] = None
                continue
            value = duration(name, text)
            if not least <= value <= MAX_SECONDS:
                fail(f"{name}: {text!r} must be between {format_duration(least)} and 24h")
            values[name] = value
        if checkpoint is not None and not checkpoint.strip():
            fail("--checkpoint: '' names no path")
        err = Console(stderr=True)
        verdict = check_workload(
            command,
            grace=values["--grace"] or 0.0,
            timeout=values["--timeout"] or 60.0,
            checkpoint=checkpoint,
            warmup=values["--warmup"],
            workdir=Path.cwd(),
            say=lambda line: err.print(f"[dim]{line}[/dim]") if not json_out else None,
        )
        if json_out:
            typer.echo(json.dumps(verdict.to_dict(), indent=2))
        else:
            out = tables.console(highlight=False)
            out.print(f"checkpoints watched in {escape(verdict.checkpoint)}")
            t = Table(
                tables.fixed("RESULT"),
                tables.text("CHECK", ratio=3),
                tables.text("OBSERVED BY", ratio=1),
                box=box.SIMPLE_HEAD,
                expand=tables.width() is not None,  # a pipe: as wide as the cells
            )
            for c in verdict.checks:
                result = "[green]pass[/green]" if c.ok else "[red]FAIL[/red]" if c.ok is False else "[dim]—[/dim]"
                t.add_row(result, f"[bold]{escape(c.name)}[/bold]\n{escape(c.detail)}", escape(c.how))
            tables.show(out, t)
            out.print(
                "[green]the workload honours the preemption contract[/green]"
                if verdict.ok
                else "[red]the workload does not honour the preemption contract[/red]"
            )
            if verdict.declare is not None:
                out.print(verdict.declare, markup=False)
        raise typer.Exit(0 if verdict.ok else 1)
