"""`tunebot compare JOB JOB...` and `tunebot sweep MODEL key=v1,v2 ... max_cost=$X`: what the money bought.

Both go through the chat's own grammar and handlers (bot/chat/grammar.py, handlers.py) as the console's
operator, so the command line, the console and Slack accept the same words and give the same answers; the
replies are rendered as the console renders them. `sweep` prints the sweep's estimate; with ``--yes`` it
launches it, and with ``--wait`` it follows it here (ticking the engine) until it ends, the stage decisions,
the runs compared and the winner printed as they come. Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import time
from typing import Any

import typer

from bot.commands import chat_door
from bot.commands.errors import fail


def compare_command(
    job_ids: list[str] = typer.Argument(..., help="Two jobs or more (or one sweep id)."),
    user: str | None = typer.Option(None, "--user", help="Who asks (default: $USER): their own jobs."),
) -> None:
    """Runs side by side: settings that differ, eval loss before and after, cost, time; the eval-curve
    chart's path (cost marked) under the table."""
    engine, _, reply = chat_door.run(["compare", *job_ids], user)
    try:
        chat_door.show_answer(reply)
    finally:
        engine.close()


def sweep_command(
    model: str = typer.Argument(..., help="Hub id, short name or model folder."),
    words: list[str] = typer.Argument(
        None,
        metavar="[KEY=VALUE]...",
        help="Options as in /tune; swept ones take values: lr=1e-4,2e-4 r=8,16.",
    ),
    user: str | None = typer.Option(None, "--user", help="Who asks (default: $USER)."),
    yes: bool = typer.Option(False, "--yes", help="Launch the sweep (without it: its estimate only)."),
    wait: bool = typer.Option(False, "--wait", help="Follow the sweep here until it ends (implies --yes)."),
) -> None:
    """The best run for a budget: every configuration to a first stage, the better half onwards, the losers
    stopped; never more than max_cost in total; ends with the runs compared and the winner's adapter."""
    engine, (chat, actor), reply = chat_door.run(["sweep", model, *(words or [])], user)
    try:
        chat_door.show_answer(reply)
        if not (yes or wait):
            return
        if not reply.buttons:  # priced, but max_cost does not cover its worst case (the note above says so)
            fail("not launched: raise max_cost or sweep fewer values")
        estimate_id = next(b.value for b in reply.buttons if b.action == "launch_sweep")
        launched = chat.launch(estimate_id, "sweep", actor)
        chat_door.show_answer(launched)
        if wait:
            _follow(engine, actor.user)
    finally:
        engine.close()


def _follow(engine: Any, user: str) -> None:
    """Tick the engine until the newest sweep of ``user`` ends, printing what the console prints."""
    from sqlalchemy import select

    from bot.chat.console import ConsoleNotifier
    from bot.chat.terminal import cli_console
    from store.models import Sweep

    notifier = ConsoleNotifier(engine, cli_console()).attach(engine.bus)
    with engine.session() as s:
        sweep_id = s.execute(
            select(Sweep.id).where(Sweep.owner == user).order_by(Sweep.created_at.desc()).limit(1)
        ).scalar_one()
    while engine.get_sweep(sweep_id).state in ("running", "pending_approval"):
        engine.tick()
        time.sleep(1.0)
    engine.tick()
    del notifier


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_command)
    app.command("sweep")(sweep_command)
