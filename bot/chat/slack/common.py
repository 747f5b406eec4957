"""Small helpers the listeners share: who acted, and how a Reply goes back to Slack."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from bot.chat.blockkit import to_message
from bot.chat.handlers import Actor, ChatHandlers
from bot.chat.replies import Reply

T = TypeVar("T")


def chat_of(context: Any) -> ChatHandlers:
    return context["chat"]  # type: ignore[no-any-return]


def actor_of(body: dict[str, Any]) -> Actor:
    """The acting user and channel of a slash command or an interactivity payload."""
    user = body.get("user_id") or (body.get("user") or {}).get("id") or "unknown"
    channel = body.get("channel_id") or (body.get("channel") or {}).get("id")
    return Actor(str(user), channel)


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Engine calls are synchronous: keep them off the event loop so acks stay fast."""
    return await asyncio.to_thread(fn, *args)


async def send(respond: Any, reply: Reply, *, replace_original: bool = False) -> None:
    await respond(
        **to_message(reply),
        response_type="in_channel" if reply.public else "ephemeral",
        replace_original=replace_original,
    )
