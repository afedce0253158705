"""Entry point of the `warden` command: one typer app, one sub-app per noun."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="warden",
    help="warden: a scheduler for shared GPU clusters that governs preemption.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    """Attach the sub-commands; each lives in its own module under warden.cli."""
    from warden.cli import bench as bench_cli
    from warden.cli import demo as demo_cli
    from warden.cli import policy as policy_cli
    from warden.cli import sim as sim_cli

    app.add_typer(demo_cli.app, name="demo")
    app.add_typer(policy_cli.app, name="policy")
    app.add_typer(bench_cli.app, name="bench")
    app.add_typer(sim_cli.app, name="sim")
    from warden.cli import check as check_cli
    from warden.cli import jobs as jobs_cli
    from warden.cli import server as server_cli

    server_cli.register(app)
    jobs_cli.register(app)
    check_cli.register(app)


_register()


def run() -> None:
    app()


if __name__ == "__main__":
    run()
