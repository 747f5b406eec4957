"""`tunebot` command line: one typer app, each concern's commands registered from bot/commands/.

Command modules import heavy libraries (SQLAlchemy, slack-bolt, matplotlib) inside the command
functions, so `tunebot estimate` stays fast and the CLI never imports torch.
"""

from __future__ import annotations

import errno

import click
import typer
from typer.core import TyperGroup

from bot.commands import (
    budget_commands,
    calibrate_commands,
    chat_commands,
    engine_commands,
    estimate_commands,
    status_commands,
    sweep_commands,
)


def input_error_message(exc: BaseException) -> str:
    """One line for an OS, encoding or value error caused by what was typed (never a traceback)."""
    if isinstance(exc, OSError):
        if exc.errno == errno.ENAMETOOLONG:
            return "a name is longer than the file system allows"
        what = exc.strerror or type(exc).__name__
        name = f": {exc.filename}" if isinstance(exc.filename, str) and len(exc.filename) <= 200 else ""
        return f"{what}{name}"
    if isinstance(exc, UnicodeError):
        return "the input has bytes that are not valid UTF-8 text"
    return str(exc)[:500] or type(exc).__name__


class SafeGroup(TyperGroup):
    """Every command: an OSError (name too long, no such file), a UnicodeError or a ValueError that
    escaped its own checks is a clear one-line message and exit code 2, never a traceback."""

    def invoke(self, ctx: click.Context):  # type: ignore[no-untyped-def]
        try:
            return super().invoke(ctx)
        except (OSError, UnicodeError, ValueError) as exc:
            message = input_error_message(exc).encode("utf-8", "backslashreplace").decode("utf-8")
            click.echo(f"error: {message}", err=True)
            ctx.exit(2)


app = typer.Typer(
    cls=SafeGroup,
    name="tunebot",
    help="Estimate, launch and babysit cheap LLM fine-tunes on budget GPU clouds.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _each_command(ctx: typer.Context) -> None:
    """Every command but `serve` (it configures its own log): warnings and errors as one line on stderr, their
    tracebacks in the data folder's log (bot/commands/cli_log.py)."""
    if ctx.invoked_subcommand != "serve":
        from bot.commands import cli_log

        ctx.call_on_close(cli_log.configure())


estimate_commands.register(app)
engine_commands.register(app)
chat_commands.register(app)
calibrate_commands.register(app)
budget_commands.register(app)
sweep_commands.register(app)
status_commands.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
