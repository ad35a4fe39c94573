"""Helpers shared by the CLI commands: clean errors instead of tracebacks, user data shown as is.

Rich reads `[...]` in a printed string as markup: a prompt holding `[/INST]` (the Llama-2 chat
format) raises MarkupError, and `[bold red]x` would be shown as a styled `x`. Anything that comes
from the user (values, column names, file names, paths, exception messages) therefore goes to rich
as a `Text` (`plain`), never inside a markup string; `data_table` builds tables that way.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

err_console = Console(stderr=True)


# Control characters other than tab and newline (ESC, NUL, CR, BEL, DEL, C1) are shown as escapes:
# written raw, a value holding "\x1b[31m" or "\x1b]0;..." would restyle or retitle the terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(value: Any, style: str = "") -> Text:
    """`value` as rich text shown verbatim: no markup, no emoji codes, no highlighting, and
    control characters as visible escapes (`\x1b`, `\x00`, `\r`)."""
    text = _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(value))
    return Text(text, style=style)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `error: message` in red on stderr and exit with `code` (no traceback). The message
    is shown verbatim (it often quotes user input)."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", plain(message)), highlight=False,
                      soft_wrap=True)
    raise typer.Exit(code)


def data_table(title: Any = "", columns: list[Any] = (), **kwargs: Any) -> Table:
    """A rich table whose title and column headers are shown verbatim; give `add_row` Texts
    (`plain`) or use `add_plain_row`."""
    table = Table(title=plain(title) if title else None, **kwargs)
    for col in columns:
        if isinstance(col, tuple):
            name, opts = col
            table.add_column(plain(name), **opts)
        else:
            table.add_column(plain(col))
    return table


def add_plain_row(table: Table, *cells: Any) -> None:
    """Add one row; every cell is shown verbatim (a Text is kept as it is, for styled cells)."""
    table.add_row(*(c if isinstance(c, Text) else plain(c) for c in cells))
