"""Stop on a job's status card (the owner or an admin)."""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.chat.slack.common import actor_of, after_ack, chat_of


async def stop_callback(
    ack: AsyncAck,
    body: dict[str, Any],
    action: dict[str, Any],
    respond: AsyncRespond,
    context: Any,
    logger: Logger,
) -> None:
    await ack()
    chat = chat_of(context)
    # The card itself is updated by the notifier on the stopped event; the clicker gets a line.
    after_ack(chat.stop, action.get("value", ""), actor_of(body), respond=respond, logger=logger, what="stop")
