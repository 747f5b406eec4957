"""The neutral reply model: what the bot says, with no knowledge of Slack or of the terminal.

A Reply is an ordered list of parts (header, text, fields, table, context, buttons, image) plus a
plain-text fallback. ``blockkit.py`` renders it to Block Kit, ``terminal.py`` to rich. Text uses the
small markup both understand: ``*bold*`` and ```code```.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bot.chat.escaping import esc


@dataclass(frozen=True)
class Header:
    text: str


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Fields:
    items: list[tuple[str, str]]


@dataclass(frozen=True)
class Table:
    columns: list[str]
    rows: list[list[str]]
    title: str | None = None


@dataclass(frozen=True)
class Context:
    items: list[str]


@dataclass(frozen=True)
class Confirm:
    title: str
    text: str
    ok: str = "Yes"
    deny: str = "Cancel"


@dataclass(frozen=True)
class Button:
    label: str
    action: str  # the action id adapters route on
    value: str = ""  # a compact reference (estimate id, job id), never a secret
    style: Literal["primary", "danger"] | None = None
    confirm: Confirm | None = None


@dataclass(frozen=True)
class Buttons:
    buttons: list[Button]


@dataclass(frozen=True)
class Image:
    alt: str
    path: Path | None = None  # a local PNG (uploaded as a file by Slack, printed as a path by the console)
    url: str | None = None
    title: str | None = None


@dataclass(frozen=True)
class Divider:
    pass


Part = Header | Text | Fields | Table | Context | Buttons | Image | Divider


@dataclass
class Reply:
    parts: list[Part] = field(default_factory=list)
    fallback: str = ""  # plain text for notifications and clients without blocks
    public: bool = False  # visible to the channel (Slack in_channel) instead of only the asker
    kind: Literal["info", "error", "warning", "success"] = "info"

    def text(self) -> str:
        """The fallback, or one derived from the first header and text."""
        if self.fallback:
            return self.fallback
        bits: list[str] = []
        for part in self.parts:
            if isinstance(part, Header | Text):
                bits.append(part.text)
            if len(bits) >= 2:
                break
        return " - ".join(bits) or "tunebot"

    def add(self, *parts: Part) -> Reply:
        self.parts.extend(parts)
        return self

    @property
    def buttons(self) -> list[Button]:
        return [b for p in self.parts if isinstance(p, Buttons) for b in p.buttons]


def error_reply(message: str, usage: str | None = None) -> Reply:
    """A correction for the person: what was wrong, and how to write it. ``message`` is plain text (an
    exception's words, which may quote what the person typed): it is escaped, never read as markup."""
    message = esc(message)
    reply = Reply(fallback=f"Sorry: {message}", kind="error")
    reply.add(Text(f":warning: {message}"))
    if usage:
        reply.add(Text(f"```{esc(usage)}```"))
    return reply


def text_reply(message: str, *, public: bool = False, kind: str = "info") -> Reply:
    return Reply(parts=[Text(message)], fallback=message, public=public, kind=kind)  # type: ignore[arg-type]
