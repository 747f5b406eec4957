"""`tunebot` command line: one typer app, each concern's commands registered from bot/commands/.

Command modules import heavy libraries (SQLAlchemy, slack-bolt, matplotlib) inside the command
functions, so `tunebot estimate` stays fast and the CLI never imports torch.
"""

from __future__ import annotations

import typer

from bot.commands import calibrate_commands, chat_commands, engine_commands, estimate_commands

app = typer.Typer(
    name="tunebot",
    help="Estimate, launch and babysit cheap LLM fine-tunes on budget GPU clouds.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

estimate_commands.register(app)
engine_commands.register(app)
chat_commands.register(app)
calibrate_commands.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
