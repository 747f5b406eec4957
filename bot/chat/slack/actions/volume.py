"""Delete / Keep on an idle-volume reminder."""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.chat.slack.common import actor_of, after_ack, chat_of


async def volume_callback(
    ack: AsyncAck,
    body: dict[str, Any],
    action: dict[str, Any],
    respond: AsyncRespond,
    context: Any,
    logger: Logger,
) -> None:
    await ack()
    verb = action["action_id"].removeprefix("volume_")
    chat = chat_of(context)
    after_ack(
        chat.volume_action,
        action.get("value", ""),
        verb,
        actor_of(body),
        respond=respond,
        logger=logger,
        what="volume action",
        replace=lambda reply: reply.public,
    )
