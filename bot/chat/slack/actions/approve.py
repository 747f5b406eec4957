"""Approve / Reject on an approval request (admins only, never one's own job)."""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.chat.slack.common import actor_of, after_ack, chat_of


async def approve_callback(
    ack: AsyncAck,
    body: dict[str, Any],
    action: dict[str, Any],
    respond: AsyncRespond,
    context: Any,
    logger: Logger,
) -> None:
    await ack()
    chat = chat_of(context)
    # The request card is replaced by the outcome; a refusal goes to the clicker only.
    after_ack(
        chat.approve,
        action.get("value", ""),
        actor_of(body),
        respond=respond,
        logger=logger,
        what="approve",
        replace=lambda reply: reply.kind == "success",
    )


async def reject_callback(
    ack: AsyncAck,
    body: dict[str, Any],
    action: dict[str, Any],
    respond: AsyncRespond,
    context: Any,
    logger: Logger,
) -> None:
    await ack()
    chat = chat_of(context)
    after_ack(
        chat.reject,
        action.get("value", ""),
        actor_of(body),
        respond=respond,
        logger=logger,
        what="reject",
        replace=lambda reply: reply.public,
    )
