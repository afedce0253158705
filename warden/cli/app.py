"""The typer app every `warden` command and sub-app is built on, and the CLI's one way to refuse.

Help is click's plain text, wrapped to the terminal (`$COLUMNS`), not typer's rich panels: it
reads at 80 columns, and printing it loads no rich. Each value is named by what it is, from its
option's name (`--lease LEASE`, `COMMAND...`), never by its Python type (`<str>`, `<int>`).
Kept light: `warden --help` and every quick verb import this first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import typer
from typer._click import Context, HelpFormatter, Parameter  # typer's own click (typer is pinned)
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.models import CommandFunctionType

EXIT_REFUSED = 2
"""Bad input: one message naming the option and the value; nothing was changed."""


def fail(message: str, code: int = EXIT_REFUSED) -> NoReturn:
    """Print `error: MESSAGE` on stderr and exit `code` (2 unless told)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _name_values(params: Sequence[Parameter]) -> None:
    """Give every option that takes a value a metavar of its name in capitals unless it has
    one, what help shows in place of a type; and every argument its metavar (or name) as the
    usage line shows it: `JOB_ID`, `[JOB_ID]...` for any number, `COMMAND...` for one or more."""
    for p in params:
        if p.name is None:
            continue
        if isinstance(p, TyperOption):
            if p.metavar is None and not p.is_flag and not p.count:
                p.metavar = p.name.upper()
        elif isinstance(p, TyperArgument):
            name = p.metavar or p.name.upper()
            p.metavar = (name if p.required else f"[{name}]") + ("..." if p.nargs != 1 else "")


def _format_params(command: TyperCommand | TyperGroup, ctx: Context, formatter: HelpFormatter) -> None:
    """The arguments and options of `command`, each by its metavar and help, no type tag."""
    arguments, options = [], []
    for p in command.get_params(ctx):
        record = p.get_help_record(ctx)
        if record is None:
            continue
        if isinstance(p, TyperArgument):
            arguments.append((p.metavar or "", record[1]))
        else:
            options.append(record)
    if arguments:
        with formatter.section("Arguments"):
            formatter.write_dl(arguments)
    if options:
        with formatter.section("Options"):
            formatter.write_dl(options)


class Command(TyperCommand):
    """A command whose help names values, not types (`_name_values`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _name_values(self.params)

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        _format_params(self, ctx, formatter)

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        """`[OPTIONS] JOB_ID`, `[OPTIONS] COMMAND...`: each argument by its metavar."""
        pieces = [self.options_metavar] if self.options_metavar else []
        return pieces + [p.metavar for p in self.get_params(ctx) if isinstance(p, TyperArgument) and p.metavar]


class Group(TyperGroup):
    """A group of commands whose help names values, not types (`_name_values`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _name_values(self.params)

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        _format_params(self, ctx, formatter)
        self.format_commands(ctx, formatter)


class App(typer.Typer):
    """`typer.Typer` with plain help (`Command`, `Group`), no shell completion and no pretty
    tracebacks: every `warden` app and sub-app is one."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("add_completion", False)
        super().__init__(cls=Group, rich_markup_mode=None, pretty_exceptions_enable=False, **options)

    def command(
        self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **options: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        return super().command(name, cls=cls or Command, **options)
