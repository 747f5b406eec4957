"""Approve / Reject on an approval request (admins only, never one's own job)."""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.chat.handlers import GENERIC_ERROR
from bot.chat.replies import error_reply
from bot.chat.slack.common import actor_of, chat_of, in_thread, send


async def approve_callback(
    ack: AsyncAck,
    body: dict[str, Any],
    action: dict[str, Any],
    respond: AsyncRespond,
    context: Any,
    logger: Logger,
) -> None:
    await ack()
    try:
        reply = await in_thread(chat_of(context).approve, action.get("value", ""), actor_of(body))
        await send(respond, reply, replace_original=reply.kind == "success")
    except Exception:  # noqa: BLE001
        logger.exception("approve failed")
        await send(respond, error_reply(GENERIC_ERROR))


async def reject_callback(
    ack: AsyncAck,
    body: dict[str, Any],
    action: dict[str, Any],
    respond: AsyncRespond,
    context: Any,
    logger: Logger,
) -> None:
    await ack()
    try:
        reply = await in_thread(chat_of(context).reject, action.get("value", ""), actor_of(body))
        await send(respond, reply, replace_original=reply.public)
    except Exception:  # noqa: BLE001
        logger.exception("reject failed")
        await send(respond, error_reply(GENERIC_ERROR))
