"""How every CLI command refuses: one line on stderr and exit status 2 (a usage or input error)."""

from __future__ import annotations

from typing import NoReturn

import typer


def fail(message: str) -> NoReturn:
    """Print `error: MESSAGE` to stderr and stop the command with exit status 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
