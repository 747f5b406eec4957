"""Render a neutral Reply (and engine events) in the terminal with rich."""

from __future__ import annotations

import re
from typing import IO

from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape as rich_escape
from rich.markup import render as render_markup
from rich.table import Table as RichTable

from bot.chat.escaping import unescape
from bot.chat.replies import (
    Buttons,
    Context,
    Divider,
    Fields,
    Header,
    Image,
    Reply,
    Table,
    Text,
)

_BOLD = re.compile(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])")
_MENTION = re.compile(r"<@([A-Za-z0-9_.-]+)(?:\|[^>]*)?>")
_CODE = re.compile(r"`([^`\n]+)`")
_EMOJI = {
    ":warning:": "!",
    ":white_check_mark:": "✓",
    ":x:": "✗",
    ":rocket:": "🚀",
    ":hourglass:": "…",
    ":moneybag:": "$",
    ":floppy_disk:": "💾",
    ":zap:": "⚡",
    ":chart_with_downwards_trend:": "📉",
    ":octagonal_sign:": "■",
    ":wastebasket:": "🗑",
    ":bell:": "🔔",
    ":arrow_forward:": "▶",
}


PIPED_WIDTH = 200  # tables in piped output may be this wide before their cells wrap


def cli_console(file: IO[str] | None = None) -> Console:
    """A console for the command line's output (stdout by default). In a terminal it follows the terminal;
    piped (scripts, tests, `| grep`) it neither wraps text lines nor squeezes tables to 80 columns, so
    every line and value a script looks for stays whole."""
    console = Console(file=file)
    if not console.is_terminal:
        console.width = max(console.width, PIPED_WIDTH)
        console.soft_wrap = True
    return console


def escape(text: str) -> str:
    """Reply text (Slack-escaped) as literal rich text."""
    return rich_escape(unescape(text))


def markup(text: str) -> str:
    """Our tiny Slack-style markup (*bold*, `code`, ```blocks```) as rich markup, everything else escaped."""
    text = unescape(_MENTION.sub(r"@\1", text.replace("```", "")))
    for code, plain in _EMOJI.items():
        text = text.replace(code, plain)
    plain = rich_escape(text)
    if plain.endswith("\\\\") and not text.endswith("\\\\"):
        plain = plain[:-1]  # rich doubles a final backslash for a tag that would follow; none follows a line
    styled = _CODE.sub(lambda m: _styled("cyan", m.group(1)), plain)
    styled = _BOLD.sub(lambda m: _styled("bold", m.group(1)), styled)
    try:  # a last line of defence: text rich cannot read gets no styling at all
        render_markup(styled)
    except MarkupError:
        return plain
    return styled


def _styled(style: str, inner: str) -> str:
    """``inner`` (escaped) in a rich tag; its final backslashes doubled, so they cannot escape the tag."""
    backslashes = "\\" * (len(inner) - len(inner.rstrip("\\")))
    return f"[{style}]{inner}{backslashes}[/{style}]"


def render(reply: Reply, console: Console) -> None:
    """Print a reply; buttons become the console's answers (`cheapest`, `safest`, `no`)."""
    style = {"error": "red", "warning": "yellow", "success": "green"}.get(reply.kind, "")
    for part in reply.parts:
        if isinstance(part, Header):
            console.print(f"[bold {style or 'magenta'}]{escape(part.text)}[/]")
        elif isinstance(part, Text):
            console.print(markup(part.text), style=style or None, highlight=False)
        elif isinstance(part, Fields):
            grid = RichTable.grid(padding=(0, 2))
            grid.add_column(style="bold")
            grid.add_column()
            for label, value in part.items:
                grid.add_row(escape(label), markup(value))
            console.print(grid)
        elif isinstance(part, Table):
            table = RichTable(title=escape(part.title) if part.title else None, title_justify="left")
            for col in part.columns:
                table.add_column(escape(col))
            for row in part.rows:
                table.add_row(*[markup(str(c)) for c in row])
            console.print(table)
        elif isinstance(part, Context):
            for item in part.items:
                console.print(markup(item), style="dim", highlight=False)
        elif isinstance(part, Buttons):
            choices = " | ".join(f"[bold]{escape(b.label)}[/bold]" for b in part.buttons)
            console.print(f"[dim]options:[/dim] {choices}")
        elif isinstance(part, Image):
            where = str(part.path or part.url or "")
            console.print(f"[dim]{escape(part.title or part.alt)}:[/dim] {escape(where)}")
        elif isinstance(part, Divider):
            console.rule(style="dim")
