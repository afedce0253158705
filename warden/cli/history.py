"""`warden history export`: the server's own jobs as a native trace, for `warden sim run`
(docs/traces.md, *Exported traces*).

CSV goes to stdout unless `-o FILE` says where; Parquet, being bytes, needs `-o`. A bad
option prints one message naming it and exits 2, as a refusal by the server does.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from warden.cli.app import App, duration
from warden.cli.jobs import CaOpt, TokenOpt, UrlOpt, client

app = App(no_args_is_help=True)

EXIT_INVALID = 2
WINDOW_MAX_S = 400 * 86400.0
"""The longest window `--since` (and `policy diff --replay`) may name: the server's bound."""

_err = Console(stderr=True)


def fail(message: str) -> typer.Exit:
    _err.print(f"[bold red]error:[/] {message}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(EXIT_INVALID)


def warn(message: str | None) -> None:
    """A warning on stderr: the server's about an export (`Client.export_history`), if any."""
    if message:
        _err.print(f"[bold yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def window(option: str, text: str) -> float:
    """A look-back window like `30d` or `12h`, in seconds: positive, at most 400 days."""
    seconds = duration(option, text)
    if seconds <= 0:
        raise fail(f"{option}: {text!r} must be a positive duration, e.g. 30d")
    if seconds > WINDOW_MAX_S:
        raise fail(f"{option}: {text!r} is more than {WINDOW_MAX_S / 86400:.0f} days")
    return seconds


@app.command("export")
def export(
    since: Annotated[
        str, typer.Option("--since", help="How far back: jobs submitted in the last 30d, 12h, … (at most 400d).")
    ] = "30d",
    format: Annotated[str, typer.Option("--format", help="native (CSV) or parquet.")] = "native",
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Write the trace to FILE (default: stdout; parquet needs it).", show_default=False
        ),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """The jobs submitted in the window that have run (finished, running, or requeued), as a
    native trace that `warden sim run --trace FILE` loads as it is."""
    seconds = window("--since", since)
    if format not in ("native", "parquet"):
        raise fail(f"--format: {format!r} is not a trace format; allowed: native, parquet")
    if format == "parquet" and output is None:
        raise fail("--format parquet: Parquet is binary; name a file with -o FILE")
    with client(url, token, ca) as c:
        body, warning = c.export_history(time.time() - seconds, format)
    warn(warning)
    if output is None:
        sys.stdout.write(body.decode("utf-8"))
        sys.stdout.flush()
        return
    try:
        output.write_bytes(body)
    except OSError as err:
        raise fail(f"--output: cannot write {str(output)!r}: {err.strerror}") from None
    rows = max(0, body.count(b"\n") - 1) if format == "native" else None
    _err.print(f"trace written to {output}" + (f" ({rows} jobs)" if rows is not None else ""), highlight=False)
