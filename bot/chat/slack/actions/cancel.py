"""Cancel on an estimate card: nothing is launched from it afterwards."""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.chat.handlers import GENERIC_ERROR
from bot.chat.replies import error_reply
from bot.chat.slack.common import actor_of, chat_of, in_thread, send


async def cancel_callback(
    ack: AsyncAck,
    body: dict[str, Any],
    action: dict[str, Any],
    respond: AsyncRespond,
    context: Any,
    logger: Logger,
) -> None:
    await ack()
    try:
        reply = await in_thread(chat_of(context).cancel_estimate, action.get("value", ""), actor_of(body))
        await send(respond, reply, replace_original=True)
    except Exception:  # noqa: BLE001
        logger.exception("cancel failed")
        await send(respond, error_reply(GENERIC_ERROR))
