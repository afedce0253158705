"""Entry point of the `warden` command: one typer app, one sub-app per noun.

Start-up is most of what a quick verb costs (`warden queue --json`), so `run` attaches only
the sub-commands its command line names: `warden queue` never imports the simulator, the
demo or matplotlib. `app` (what tests import) has every sub-command.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import import_module
from typing import Any

import typer

GROUPS = ("demo", "policy", "bench", "sim", "history")
"""Sub-apps (`warden sim …`): the module `warden.cli.<name>` has an `app`."""
VERBS = ("server", "jobs", "status", "check")
"""Modules whose `register(app)` adds top-level verbs (`warden queue`, `warden server`…)."""


def build(argv: Sequence[str] | None = None) -> typer.Typer:
    """The `warden` app with the sub-commands `argv` can reach (every one when None, or when
    it names none, as for `warden --help`)."""
    app = typer.Typer(
        name="warden",
        help="warden: a scheduler for shared GPU clusters that governs preemption.",
        no_args_is_help=False,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    first = None if argv is None else next((a for a in argv if not a.startswith("-")), None)
    groups = [first] if first in GROUPS else [] if first is not None else list(GROUPS)
    verbs = list(VERBS) if first not in GROUPS else []
    for name in groups:
        app.add_typer(import_module(f"warden.cli.{name}").app, name=name)
    for name in verbs:
        import_module(f"warden.cli.{name}").register(app)
    return app


def __getattr__(name: str) -> Any:
    """`from warden.cli.main import app`: the app with every sub-command, built once."""
    if name != "app":
        raise AttributeError(name)
    app = globals()["app"] = build()
    return app


def run() -> None:
    build(sys.argv[1:])()


if __name__ == "__main__":
    run()
