"""Commands registered on the `tunebot` app (filled in by the owning concern)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
