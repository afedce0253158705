"""`warden server`: run the control plane — the engine on the real clock, the database, the
HTTP API and the local executor — until interrupted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("server")
    def server(
        db: Annotated[
            str | None,
            typer.Option(
                "--db",
                help="Database URL (default: SQLite in the state directory; postgresql://… for PostgreSQL).",
                show_default=False,
            ),
        ] = None,
        policy: Annotated[
            Path | None,
            typer.Option(
                "--policy", help="Policy YAML applied at start (a new version when it changed).", show_default=False
            ),
        ] = None,
        host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
        port: Annotated[int, typer.Option("--port")] = 8765,
        fake_gpus: Annotated[
            int | None,
            typer.Option("--fake-gpus", help="Pretend this machine has N GPUs (no GPU needed).", show_default=False),
        ] = None,
        state_dir: Annotated[
            Path | None,
            typer.Option(
                "--state-dir",
                help="Logs, checkpoints and the default database (default $WARDEN_STATE_DIR or ~/.local/state/warden).",
                show_default=False,
            ),
        ] = None,
        bootstrap_token: Annotated[
            str | None,
            typer.Option(
                "--bootstrap-token",
                envvar="WARDEN_BOOTSTRAP_TOKEN",
                help="Make this an admin token at start.",
                show_default=False,
            ),
        ] = None,
    ) -> None:
        """Run the warden server on this machine."""
        from warden.engine.policy import PolicyError
        from warden.server.app import Settings, serve

        if fake_gpus is not None and fake_gpus < 0:
            typer.echo(f"error: --fake-gpus: {fake_gpus} must not be negative", err=True)
            raise typer.Exit(2)
        if state_dir is not None:
            os.environ["WARDEN_STATE_DIR"] = str(state_dir)
        try:
            serve(
                Settings(
                    db=db,
                    policy=policy,
                    host=host,
                    port=port,
                    fake_gpus=fake_gpus,
                    state_dir=state_dir,
                    bootstrap_token=bootstrap_token,
                ),
                say=lambda line: typer.echo(line, err=True),
            )
        except PolicyError as err:
            for issue in err.issues:
                typer.echo(f"{policy}: {issue}", err=True)
            raise typer.Exit(2) from None
