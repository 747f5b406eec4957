"""Launch cheapest / safest: the estimate id in the button, one job per estimate however many clicks."""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.chat.slack.common import actor_of, after_ack, chat_of


async def launch_callback(
    ack: AsyncAck,
    body: dict[str, Any],
    action: dict[str, Any],
    respond: AsyncRespond,
    context: Any,
    logger: Logger,
) -> None:
    await ack()
    choice = action["action_id"].removeprefix("launch_")
    chat = chat_of(context)
    after_ack(
        chat.launch,
        action.get("value", ""),
        choice,
        actor_of(body),
        respond=respond,
        logger=logger,
        what="launch",
        replace=True,
    )
