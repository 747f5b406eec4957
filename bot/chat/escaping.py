"""Slack's text escaping: user text must never become a live mention, broadcast or link.

Slack reads ``<...>`` in message text (mrkdwn, the ``text`` fallback, and our plain_text objects alike)
as control sequences: ``<!channel>``, ``<!here>``, ``<@U123>``, ``<!subteam^S1>``, ``<https://x|click>``.
Its rule (docs: "Escaping text") is to replace exactly three characters: ``&`` -> ``&amp;``, ``<`` ->
``&lt;``, ``>`` -> ``&gt;``. Every string a person (or a file, or a provider) supplied goes through
``esc`` before it is put into a Reply; the only live tokens are those built here by ``mention``.
The terminal renders the same replies and turns the entities back with ``unescape``.
"""

from __future__ import annotations

import re

USER_ID = re.compile(r"^[UW][A-Z0-9]{2,30}$")  # Slack user ids (U..., W... on Enterprise Grid)


def esc(text: object) -> str:
    """Text as Slack shows it literally: & < > escaped (nothing else: *bold* and `code` stay markup)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def unescape(text: str) -> str:
    """The inverse of ``esc`` (for the terminal, which shows the characters themselves)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def mention(user: str | None) -> str:
    """A live @-mention for a real Slack user id; anything else (console names) as escaped plain text."""
    if not user:
        return "someone"
    if USER_ID.match(user):
        return f"<@{user}>"
    return "@" + esc(user)


LIVE_TOKEN = re.compile(r"<(?:[!@#][^<>]*|(?:https?|mailto|ftp|file|slack):[^<>]*)>", re.IGNORECASE)


def live_tokens(text: str) -> list[str]:
    """The control sequences Slack would act on in ``text`` (for tests and checks)."""
    return LIVE_TOKEN.findall(text)
