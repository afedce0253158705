"""Tables that fit the terminal: the one width every table of the CLI is laid out for, listings
with a default set of columns and `--wide` for all, and tables of records (one row a policy)
that turn on their side when they are too wide.

The width is `$COLUMNS` when set, else the terminal's; a pipe or a file has no width, so every
table there prints whole. Wherever a table is printed no cell is cut to "…": text cells wrap,
and a table that cannot fit even so prints wider than the terminal rather than losing values.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # rich is loaded by what prints a table, not by importing this module
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Column, Table

WHOLE = 10_000
"""The width of a console without a width (a pipe, a file): wider than any table."""
READABLE = 20
"""How narrow a column of text wraps before the next one gives way."""
MIN_TEXT = 8
"""How narrow a column of text may fold before the table is let past the width instead."""
GAP = 1
"""Spaces between the columns of a listing, as `squeue` has them: at 80 columns every one counts."""


def width() -> int | None:
    """The columns output may use: `$COLUMNS` when set, the terminal's width when stdout is a
    terminal, None (no limit) for a pipe or a file."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    from rich.console import Console

    probe = Console()
    return probe.width if probe.is_terminal else None


def console(**options: Any) -> Console:
    """A stdout console laid out for `width()` (a pipe or a file: as wide as any table)."""
    from rich.console import Console

    return Console(width=width() or WHOLE, **options)


def natural(table: Table) -> Measurement:
    """The table's widths with no limit: minimum (text cells wrapped at words) and maximum
    (every cell on one line)."""
    from rich.console import Console
    from rich.measure import Measurement

    probe = Console(width=WHOLE)
    return Measurement.get(probe, probe.options, table)


def show(con: Console, *renderables: Any) -> None:
    """Print tables (and text) on `con`, never cutting a cell to "…": a word too long for its
    column folds, and a table whose cells cannot all fit the width, even wrapped, prints at its
    least width instead."""
    from rich.table import Table

    for r in renderables:
        least = 0
        if isinstance(r, Table):
            for column in r.columns:
                if column.overflow == "ellipsis":
                    column.overflow = "fold"
            least = natural(r).minimum
        if least <= con.width:
            con.print(r)
            continue
        before = con.width
        con.width = least
        try:
            con.print(r)
        finally:
            con.width = before


def titled(con: Console, title: str, table: Table) -> None:
    """A borderless table under its title, a blank line above: a section of a longer report."""
    con.print(f"\n[bold]{title}[/bold]")
    show(con, table)


@dataclass(frozen=True)
class Col:
    """A listing's column. `wide`: shown only with `--wide`. `gives`: a column of text that
    wraps when the row is too wide (lower numbers first, see `listing`); the others never wrap."""

    header: str
    justify: Literal["left", "right"] = "left"
    wide: bool = False
    gives: int = 0


def listing(columns: Sequence[Col], rows: Sequence[Sequence[str]], wide: bool = False) -> Table:
    """A borderless table of `rows` (one string a column) like `squeue`'s or `kubectl get`'s:
    the default columns, or all with `wide`, each as wide as its longest cell; when that is wider
    than `width()`, the `gives` columns wrap, in their order, until the row fits (with `wide`,
    only between words)."""
    from rich.cells import cell_len
    from rich.table import Table

    if any(len(r) != len(columns) for r in rows):
        raise ValueError(f"a listing of {len(columns)} columns got a row of another length")
    shown = [i for i, c in enumerate(columns) if wide or not c.wide]
    widths = {i: max([cell_len(columns[i].header), *(_longest_line(r[i]) for r in rows)]) for i in shown}
    limit = width()
    excess = 0 if limit is None else sum(widths.values()) + GAP * (len(shown) - 1) - limit
    caps = dict(widths)
    giving = sorted((i for i in shown if columns[i].gives), key=lambda i: columns[i].gives)
    # The text wraps between words: in the columns' order down to lines that still read as
    # phrases, then in the reverse order down to their longest words; only then (and not with
    # --wide, which may take the room it needs) do long words fold, in the columns' order.
    steps = [(READABLE, giving), (0, giving[::-1])] + ([] if wide else [(None, giving)])
    for step, order in steps:
        for i in order:
            floor = max(MIN_TEXT, _longest_word(columns[i].header))
            if step is not None:
                floor = max([floor, step, *(_longest_word(r[i]) for r in rows)])
            cut = max(0, min(excess, caps[i] - floor))
            caps[i] -= cut
            excess -= cut
    table = Table(box=None, padding=(0, GAP, 0, 0), pad_edge=False, header_style="bold")
    for i in shown:
        # Each column as wide as computed above, exactly: rich, left to measure, squeezes a text
        # column below its longest word (a header's too) when the table is wider than the terminal.
        c = columns[i]
        table.add_column(c.header, justify=c.justify, no_wrap=not c.gives, overflow="fold", width=caps[i])
    for r in rows:
        table.add_row(*(r[i] for i in shown))
    return table


def number(x: Any) -> str:
    """A number in a cell as people read it, never in scientific notation: a whole one with
    thousands separators, any other to four significant digits, trailing zeros dropped; "—"
    for none."""
    if x is None:
        return "—"
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return str(x)
    v = float(x)
    if v.is_integer():
        return f"{int(v):,}"
    text = f"{v:,.{max(0, 3 - math.floor(math.log10(abs(v))))}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def text(header: str, **options: Any) -> Column:
    """A column of free text (reasons, messages, details) in a table that is not a listing: it
    wraps at words and folds a word longer than the column, never cutting it to "…"."""
    from rich.table import Column

    return Column(header, overflow="fold", **options)


def fixed(header: str, **options: Any) -> Column:
    """A column whose cells read only whole (times, ids, numbers): it never wraps."""
    from rich.table import Column

    return Column(header, no_wrap=True, **options)


def records(table: Table, names: Mapping[str, str] | None = None, label: str = "") -> list[Table]:
    """`table` (one row a record, its first column naming the record) as it fits `width()`:
    whole when it does; else on its side, one row a column of it (named in full by `names`,
    keyed by header) and one column a record, split into as many tables as it takes."""
    from rich import box
    from rich.table import Table

    limit = width()
    if limit is None or natural(table).maximum <= limit:
        return [table]
    keys = [str(cell) for cell in table.columns[0].cells]
    fields = [((names or {}).get(str(c.header), str(c.header)), list(c.cells)) for c in table.columns[1:]]

    def side(picked: list[int]) -> Table:
        t = Table(fixed(label), box=table.box or box.HEAVY_HEAD, header_style=table.header_style)
        for r in picked:
            t.add_column(keys[r], justify="right", no_wrap=True)
        for name, cells in fields:
            t.add_row(name, *(cells[r] for r in picked))
        return t

    chunks: list[list[int]] = []
    current: list[int] = []
    for r in range(len(keys)):
        if current and natural(side([*current, r])).maximum > limit:
            chunks.append(current)
            current = []
        current.append(r)
    chunks.append(current)
    return [side(c) for c in chunks]


def _longest_line(cell: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in cell.split("\n")), default=0)


def _longest_word(cell: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(word) for word in cell.split()), default=0)
