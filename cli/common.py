"""Helpers shared by the CLI commands: clean errors instead of tracebacks."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `error: message` in red on stderr and exit with `code` (no traceback)."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)
