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
from typer._click import Command as ClickCommand  # typer's own click (typer is pinned)
from typer._click import Context, HelpFormatter, Parameter
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.models import CommandFunctionType

EXIT_REFUSED = 2
"""Bad input: one message naming the option and the value; nothing was changed."""


def fail(message: str, code: int = EXIT_REFUSED) -> NoReturn:
    """Print `error: MESSAGE` on stderr and exit `code` (2 unless told)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def duration(option: str, text: str) -> float:
    """The seconds a duration option (`--lease 10m`) gives; refused (exit 2, the option and the
    value named) when it is no duration, or a bare number: whether `10` meant seconds or minutes
    is not guessed."""
    from warden.engine.durations import PolicyError, is_bare_number, parse_duration

    if is_bare_number(text):
        fail(f"{option}: {text!r} has no unit: give one, e.g. 600s or 10m")
    try:
        return parse_duration(text)
    except PolicyError as err:
        fail(f"{option}: {text!r} is not a duration ({err.issues[0].message}), e.g. 600s or 10m")


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


def _format_params(command: ClickCommand, ctx: Context, formatter: HelpFormatter) -> None:
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


class _PlainHelp(ClickCommand):
    """Help that names values, not types (`_name_values`, `_format_params`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _name_values(self.params)

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        _format_params(self, ctx, formatter)


class Command(_PlainHelp, TyperCommand):
    """A command of `App`."""

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        """`[OPTIONS] JOB_ID`, `[OPTIONS] COMMAND...`: each argument by its metavar."""
        pieces = [self.options_metavar] if self.options_metavar else []
        return pieces + [p.metavar for p in self.get_params(ctx) if isinstance(p, TyperArgument) and p.metavar]


class AfterDashes(Command):
    """A command whose last argument is a command line, given after `--`: everything before
    `--` is options, a word there that is none is refused (exit 2, naming it), and `--` is never
    part of the command (`warden submit -q team -t 3 -- python train.py`)."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        if "--help" in args[: args.index("--") if "--" in args else len(args)]:
            return super().parse_args(ctx, args)
        cut = args.index("--") if "--" in args else len(args)
        before, after = args[:cut], args[cut + 1 :]
        found, extra, _ = self.make_parser(ctx).parse_args(args=list(before))
        strays = [*(w for p in self.params if isinstance(p, TyperArgument) for w in found.get(p.name) or ()), *extra]
        example = f"warden {ctx.command_path.split(' ', 1)[-1]} [OPTIONS] -- python train.py"
        if strays:
            fail(f"{strays[0]!r} is no option: options go before --, the command after it ({example})")
        if not after:
            fail(f"no command: give it after -- ({example})")
        return super().parse_args(ctx, [*before, "--", *after])

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        """`[OPTIONS] -- COMMAND...`."""
        pieces = super().collect_usage_pieces(ctx)
        return [*pieces[:-1], "--", pieces[-1]]


class Group(_PlainHelp, TyperGroup):
    """A group of commands of `App`: its options, then its commands."""

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        super().format_options(ctx, formatter)
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
