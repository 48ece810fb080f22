"""Every table the command line prints: a rich table on a terminal, plain aligned text
anywhere else.

Rich fits a table to the console's width; in a pipe or a file that width is a guess (80
columns), and long cells fold letter by letter into columns nobody can read or parse. So
when the console is not a terminal, a table is printed as plain text instead: a title
line, a header, a rule of dashes and one line per row, each cell whole, columns two spaces
apart. The decision is made here and nowhere else, as is the console's (`command_console`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

Cell = str | Text
"""A cell: a ``str`` is shown as it is (never read as markup); a ``Text`` keeps its style
on a terminal and is shown as its plain text elsewhere."""


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its header, its alignment, and whether rich may wrap it on a terminal."""

    header: str
    justify: Literal["left", "right"] = "left"
    wrap: bool = False


def command_console() -> Console:
    """The console a command prints on: off a terminal, lines are never wrapped either (a
    failed check's detail stays one line a CI log can be searched for)."""
    console = Console()
    if not console.is_terminal:
        console.soft_wrap = True
    return console


def print_table(
    console: Console,
    title: str,
    columns: Sequence[Column | str],
    rows: Sequence[Sequence[Cell]],
) -> None:
    """Print a table on ``console``: rich on a terminal, plain aligned text otherwise."""
    cols = [c if isinstance(c, Column) else Column(c) for c in columns]
    for row in rows:
        if len(row) != len(cols):
            raise ValueError(f"table {title!r}: a row has {len(row)} cells for {len(cols)} columns")
    if console.is_terminal:
        console.print(_rich_table(title, cols, rows))
    else:
        console.out(plain_table(title, cols, rows), highlight=False)


def _rich_table(title: str, columns: list[Column], rows: Sequence[Sequence[Cell]]) -> Table:
    table = Table(title=title, title_justify="left")
    for c in columns:
        table.add_column(c.header, justify=c.justify, no_wrap=not c.wrap, overflow="fold")
    for row in rows:
        table.add_row(*(cell if isinstance(cell, Text) else Text(cell) for cell in row))
    return table


def plain_table(title: str, columns: Sequence[Column | str], rows: Sequence[Sequence[Cell]]) -> str:
    """The table as plain text: title, header, dashes, rows; every cell whole, one line each
    (a newline inside a cell becomes a space), no trailing spaces."""
    cols = [c if isinstance(c, Column) else Column(c) for c in columns]
    body = [[_plain(cell) for cell in row] for row in rows]
    widths = [max([len(c.header), *(len(r[i]) for r in body)]) for i, c in enumerate(cols)]
    rule = ["-" * w for w in widths]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(w) if c.justify == "right" else cell.ljust(w)
            for cell, w, c in zip(cells, widths, cols, strict=True)
        ]
        return "  ".join(parts).rstrip()

    lines = [title, line([c.header for c in cols]), line(rule), *(line(r) for r in body)]
    return "\n".join(lines)


def _plain(cell: Cell) -> str:
    text = cell.plain if isinstance(cell, Text) else cell
    return " ".join(text.split()) if "\n" in text or "\t" in text else text
