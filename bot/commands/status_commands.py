"""`tunebot status [JOB|SWEEP]`: a job's card (its answers side by side under it), a sweep's card with its
runs, or the active jobs of whoever asks (the operator, or ``--user``).

It is the chat's `status`, through the chat's grammar and handlers as the operator (as `compare` and `sweep`
are), so what a reply suggests ("`status sw-...` shows them") works as typed at every door: Slack, the
console and here.
"""

from __future__ import annotations

import typer


def status_command(
    ref: str | None = typer.Argument(None, metavar="[JOB|SWEEP]", help="A job id or a sweep id (sw-...)."),
    user: str | None = typer.Option(None, "--user", help="Who asks (default: the operator)."),
) -> None:
    """A job's or a sweep's status; without an id, the active jobs."""
    from bot.commands.chat_door import answer

    answer(["status", *([ref] if ref else [])], user)


def register(app: typer.Typer) -> None:
    app.command("status")(status_command)
