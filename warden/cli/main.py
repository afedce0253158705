"""Entry point of the `warden` command: one app, one sub-app per noun.

Start-up is most of what a quick verb costs (`warden queue`, `warden --help`), so `run`
imports only the sub-app its command line names: `warden queue` never imports the simulator,
the demo or matplotlib, and `warden --help` lists the sub-apps by the help they are given here
without importing any. `app` (what tests import) has every sub-command.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import import_module
from typing import Any

import typer
from typer.main import get_command_name
from typer.models import CommandInfo

from warden.cli.app import App

GROUPS = {
    "demo": "Show the engine's decisions on a bundled busy cluster.",
    "policy": "Check, show and describe policy files (tiers, limits, fair share, queue tree).",
    "bench": "Measure warden's components on this machine.",
    "sim": "Replay a trace through the engine and compare policies side by side.",
    "history": "The server's history: export its jobs as a trace.",
}
"""Sub-apps (`warden sim …`) and their help: the module `warden.cli.<name>` has an `app`."""
VERBS = ("server", "jobs", "status", "check")
"""Modules whose `register(app)` adds top-level verbs (`warden queue`, `warden server`…)."""


def build(argv: Sequence[str] | None = None) -> App:
    """The `warden` app with the sub-commands `argv` can reach: every one when None; else the
    sub-app it names, or the verb it names (every verb when it names none, for `warden --help`
    and for a misspelt verb's suggestions), and each sub-app as its help alone."""
    app = App(name="warden", help="warden: a scheduler for shared GPU clusters that governs preemption.")
    app.callback()(_options)
    first = None if argv is None else next((a for a in argv if not a.startswith("-")), None)
    for name in [] if first in GROUPS else VERBS:
        import_module(f"warden.cli.{name}").register(app)
    named = [c for c in app.registered_commands if _command_name(c) == first]
    if named:  # `warden queue …`: typer builds the one verb named, not all of them
        app.registered_commands = named
    for name, text in GROUPS.items():
        if argv is None or name == first:
            app.add_typer(import_module(f"warden.cli.{name}").app, name=name, help=text)
        elif first not in GROUPS:
            app.command(name, help=text, add_help_option=False)(_unreachable)
    return app


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"warden {version('gpu-warden')}")
        raise typer.Exit()


def _options(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print warden's version and exit."
    ),
) -> None:
    """Options of `warden` itself, before any command."""


def _command_name(info: CommandInfo) -> str | None:
    """The name a verb is called by: its own, else its function's, as typer names it."""
    if info.name:
        return info.name
    return None if info.callback is None else get_command_name(info.callback.__name__)


def _unreachable() -> None:
    """Stands in for a sub-app in a listing: a command line that names it builds the sub-app."""
    raise AssertionError("a sub-app named on the command line is built, never its stand-in")


def __getattr__(name: str) -> Any:
    """`from warden.cli.main import app`: the app with every sub-command, built once."""
    if name != "app":
        raise AttributeError(name)
    app = globals()["app"] = build()
    return app


def run() -> None:
    build(sys.argv[1:])(prog_name="warden")


if __name__ == "__main__":
    run()
