"""The chat's words on the command line: one command read by the chat's grammar (bot/chat/grammar.py) and
answered by its handlers as the operator (or ``--user``), the reply printed as the console prints it.

`status`, `compare`, `sweep` and a sweep's `stop` and `approve` go through here, so a command that a reply
suggests in the chat's words works as typed after `tunebot` too (tests/chat/test_suggested_commands.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from bot.chat.replies import Reply


def acting_user(user: str | None) -> str:
    """Who a command acts as: the operator unless ``--user`` names someone (engine_commands.py says why)."""
    from bot.engine.permissions import OPERATOR

    return user.strip() if user and user.strip() else OPERATOR


def show(reply: Reply) -> None:
    """Print a reply with the renderer `tunebot console` uses: the CLI, Slack and the console share cards."""
    from bot.chat.terminal import cli_console, render

    render(reply, cli_console())


def run(words: list[str], user: str | None) -> tuple[Any, Any, Any]:
    """(engine, (chat, actor), reply) of one chat command typed on the command line."""
    from bot.chat.handlers import Actor
    from bot.commands.chat_commands import _runtime
    from bot.commands.request_cli import parse_chat

    command = parse_chat(words)
    name = acting_user(user)
    _, engine, chat = _runtime(name)
    actor = Actor(name, None, operator=True)
    return engine, (chat, actor), chat.handle(command, actor)


def show_answer(reply: Reply) -> None:
    """Print the reply; a refusal (an error reply) exits with status 2, as every CLI refusal does."""
    show(reply)
    if reply.kind == "error":
        raise typer.Exit(2)


def answer(words: list[str], user: str | None) -> None:
    """Run one chat command and print its reply (exit status 2 for a refusal)."""
    engine, _, reply = run(words, user)
    try:
        show_answer(reply)
    finally:
        engine.close()
