"""Launch cheapest / safest: the estimate id in the button, one job per estimate however many clicks."""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.chat.handlers import GENERIC_ERROR
from bot.chat.replies import error_reply
from bot.chat.slack.common import actor_of, chat_of, in_thread, send


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
    try:
        reply = await in_thread(chat_of(context).launch, action.get("value", ""), choice, actor_of(body))
        await send(respond, reply, replace_original=True)
    except Exception:  # noqa: BLE001
        logger.exception("launch failed")
        await send(respond, error_reply(GENERIC_ERROR))
