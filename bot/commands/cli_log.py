"""Where the log goes while a CLI command runs (every command but `serve`, which keeps its own stream).

What the engine logs at warning or above (a taken-over launch that raised, a reconcile step that failed)
is one line on stderr, ``warning: launch of job J failed: RuntimeError: why (traceback in PATH)``, and
the whole record, traceback included, is appended to the log in the data folder:
TUNEBOT_DATA_DIR/supervisor.log, the one a background `serve --auto` writes. No traceback on the
terminal (issue 38): without this, Python's last-resort handler printed each one in full.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import click

from bot.commands.supervisor import LOG_NAME

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # the format `tunebot serve` logs in


def _redacted(text: str) -> str:
    """``text`` without the configured keys and tokens (an exception's text may carry a request's URL)."""
    from bot.providers.base import redact
    from bot.providers.registry import secrets
    from bot.settings import get_settings

    try:
        return redact(text, secrets(get_settings()))
    except Exception:  # noqa: BLE001 - settings that cannot load hold no secret to hide
        return text


def _log_path() -> Path | None:
    """The data folder's log; None when the settings cannot work (the command itself says why)."""
    from bot.settings import get_settings

    try:
        return Path(get_settings().data_dir) / LOG_NAME
    except Exception:  # noqa: BLE001 - a bad setting is the command's to report, not the log's
        return None


class _LogFile(logging.Handler):
    """Appends each record, its traceback included, to the data folder's log (opened per record: rare)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter(FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        path = _log_path()
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as out:
            out.write(_redacted(self.format(record)) + "\n")

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """A log that cannot be written is no reason to print a traceback either."""


class _OneLine(logging.Handler):
    """Each record as one line on stderr: its message and, for an exception, its type and first line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            why = (str(exc).strip().splitlines() or [""])[0][:300]
            text += f": {type(exc).__name__}" + (f": {why}" if why else "")
            if path := _log_path():
                text += f" (traceback in {path})"
        click.echo(f"{record.levelname.lower()}: {_redacted(text)}", err=True)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """Never a traceback from the handler that exists to keep them off the terminal."""


def configure() -> Callable[[], None]:
    """Send warnings and errors to one line on stderr and in full to the data folder's log, for one command;
    returns what takes the two handlers off again (a test runs many commands in one process)."""
    root = logging.getLogger()
    handlers = [_LogFile(), _OneLine()]
    for handler in handlers:
        root.addHandler(handler)

    def remove() -> None:
        for handler in handlers:
            root.removeHandler(handler)

    return remove
