"""`warden server`: run the control plane — the engine on the real clock, the database, the
HTTP API and the local executor — until interrupted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from warden.executors.identity import DEFAULT_JOB_UIDS, parse_uid_range, parse_user_map


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _bootstrap_token(path: Path | None) -> str | None:
    """The bootstrap token, from the file or else $WARDEN_BOOTSTRAP_TOKEN; never from the
    command line. The variable is removed from this process's environment, so that nothing
    it starts inherits it."""
    from_env = os.environ.pop("WARDEN_BOOTSTRAP_TOKEN", None)
    if path is None:
        return from_env or None
    try:
        token = path.read_text().strip()
    except OSError as err:
        fail(f"--bootstrap-token-file: cannot read {str(path)!r}: {err.strerror or err}")
    if not token:
        fail(f"--bootstrap-token-file: {str(path)!r} is empty")
    return token


def register(app: typer.Typer) -> None:
    @app.command("server")
    def server(
        db: Annotated[
            str | None,
            typer.Option(
                "--db",
                envvar="WARDEN_DB",
                help=(
                    "Database URL (default: SQLite in the state directory; postgresql://… for PostgreSQL). "
                    "A URL with a password belongs in $WARDEN_DB: a command line is readable in /proc."
                ),
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
        bootstrap_token_file: Annotated[
            Path | None,
            typer.Option(
                "--bootstrap-token-file",
                help="Make the token in this file an admin token at start (or set $WARDEN_BOOTSTRAP_TOKEN).",
                show_default=False,
            ),
        ] = None,
        bootstrap_token: Annotated[
            str | None, typer.Option("--bootstrap-token", hidden=True, show_default=False)
        ] = None,
        run_as: Annotated[
            str,
            typer.Option(
                "--run-as",
                help="Who jobs run as (server as root): 'dynamic', a uid of its own per attempt from --job-uids; "
                "'user', the submitting user's Unix account (see --user-map), else a dynamic uid.",
            ),
        ] = "dynamic",
        job_uids: Annotated[
            str,
            typer.Option("--job-uids", help="The uids (and gids) reserved for jobs, LO-HI."),
        ] = f"{DEFAULT_JOB_UIDS.start}-{DEFAULT_JOB_UIDS.stop - 1}",
        user_map: Annotated[
            list[str] | None,
            typer.Option(
                "--user-map",
                help="With --run-as user: WARDEN_USER=ACCOUNT (repeatable; '*=ACCOUNT' for every other user).",
                show_default=False,
            ),
        ] = None,
    ) -> None:
        """Run the warden server on this machine."""
        from warden.engine.policy import PolicyError
        from warden.server.app import Settings, serve

        if fake_gpus is not None and fake_gpus < 0:
            fail(f"--fake-gpus: {fake_gpus} must not be negative")
        if bootstrap_token is not None:
            fail(
                "--bootstrap-token: a token on the command line is visible to every user of this machine "
                "(/proc/PID/cmdline); use --bootstrap-token-file PATH or $WARDEN_BOOTSTRAP_TOKEN"
            )
        if run_as not in ("dynamic", "user"):
            fail(f"--run-as: expected 'dynamic' or 'user', got {run_as!r}")
        try:
            uids = parse_uid_range(job_uids)
            mapping = tuple(parse_user_map(user_map or ()).items())
        except ValueError as err:
            fail(str(err))
        token = _bootstrap_token(bootstrap_token_file)
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
                    bootstrap_token=token,
                    run_as="user" if run_as == "user" else "dynamic",
                    job_uids=uids,
                    user_map=mapping,
                ),
                say=lambda line: typer.echo(line, err=True),
            )
        except PolicyError as err:
            for issue in err.issues:
                typer.echo(f"{policy}: {issue}", err=True)
            raise typer.Exit(2) from None
