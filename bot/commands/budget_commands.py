"""`tunebot budget show | set user|team NAME daily=X monthly=Y`: budgets from the bot's machine.

The CLI acts as the operator, an admin of this install: where no TUNEBOT_ADMINS is configured, this is the
only door that sets budgets (no Slack member may, bot/engine/permissions.py), and Slack's refusal names it.
The words after `budget` are the `/tune budget ...` grammar (bot/chat/grammar.py), so every door parses and
answers the same; bad input exits 2 with the usage, and nothing is saved.
"""

from __future__ import annotations

import shlex

import typer

from bot.commands.errors import fail

budget_app = typer.Typer(
    name="budget",
    help="Spending budgets per person or team (the operator sets them; Slack admins too).",
    no_args_is_help=True,
)


def _engine():  # type: ignore[no-untyped-def]
    from bot.commands.engine_commands import _engine as engine

    return engine()


def _parse(words: list[str]):  # type: ignore[no-untyped-def]
    from bot.chat.grammar import ParseError, parse
    from bot.engine.permissions import BUDGET_SET

    try:
        return parse(" ".join(shlex.quote(w) for w in ["budget", *words]))
    except ParseError as exc:
        fail(f"{exc.message} (usage: {BUDGET_SET})")


@budget_app.command("show")
def show_command() -> None:
    """Every budget with what was spent against it today and this month."""
    from bot.chat.cards import budgets_reply
    from bot.commands.engine_commands import _show
    from bot.engine.permissions import BUDGET_SET

    eng = _engine()
    try:
        budgets = eng.budgets()
    finally:
        eng.close()
    _show(budgets_reply(budgets, who_sets=f"Set one with `{BUDGET_SET}`."))


@budget_app.command(
    "set",
    context_settings={"ignore_unknown_options": True},
)
def set_command(
    scope: str = typer.Argument(..., help="user or team"),
    name: str = typer.Argument(..., help="the Slack user id (U...) or team name"),
    amounts: list[str] = typer.Argument(
        ..., help="daily=X and/or monthly=Y (dollars; an unset one is cleared)"
    ),
) -> None:
    """Set a person's or a team's budget (at 100%: no new launches, running jobs stop after a checkpoint)."""
    from bot.chat.cards import budget_saved_reply
    from bot.chat.grammar import BudgetSetCmd
    from bot.commands.engine_commands import _show
    from bot.engine.api import EngineError, PermissionDenied
    from bot.engine.permissions import OPERATOR

    command = _parse(["set", scope, name, *amounts])
    if not isinstance(command, BudgetSetCmd):  # `budget set` always parses to one; a guard all the same
        fail("expected `budget set user|team NAME daily=X monthly=Y`")
    eng = _engine()
    try:
        view = eng.set_budget(
            command.scope, command.target, daily=command.daily, monthly=command.monthly, user=OPERATOR
        )
    except (EngineError, PermissionDenied) as exc:
        fail(str(exc))
    finally:
        eng.close()
    _show(budget_saved_reply(view))


def register(app: typer.Typer) -> None:
    app.add_typer(budget_app, name="budget")
