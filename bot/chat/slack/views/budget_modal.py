"""The "Set a budget" modal: field errors in the ack, the outcome by DM to whoever saved it (the engine's
refusal for anyone who may not set budgets: the same `budget set` as every other door)."""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.blockkit import to_message
from bot.chat.grammar import parse_money
from bot.chat.slack.common import actor_of, chat_of, in_thread, spawn


def _value(values: dict[str, Any], block: str) -> str:
    element = (values.get(block) or {}).get("value") or {}
    if element.get("type") == "static_select":
        return str((element.get("selected_option") or {}).get("value") or "")
    return str(element.get("value") or "").strip()


async def budget_modal_callback(
    ack: AsyncAck,
    body: dict[str, Any],
    view: dict[str, Any],
    client: AsyncWebClient,
    context: Any,
    logger: Logger,
) -> None:
    values = (view.get("state") or {}).get("values") or {}
    scope, name = _value(values, "scope") or "user", _value(values, "name")
    daily, monthly = _value(values, "daily"), _value(values, "monthly")
    errors: dict[str, str] = {}
    for block, raw in (("daily", daily), ("monthly", monthly)):
        if raw:
            try:
                parse_money(raw)
            except ValueError as exc:
                errors[block] = str(exc)
    if not daily and not monthly:
        errors["daily"] = "give a daily or a monthly amount"
    if not name or " " in name:
        errors["name"] = "one user id or team name"
    if errors:
        await ack(response_action="errors", errors=errors)
        return
    await ack()
    actor = actor_of(body)
    chat = chat_of(context)

    async def save() -> None:
        try:
            reply = await in_thread(chat.set_budget, scope, name, daily, monthly, actor)
            opened = await client.conversations_open(users=actor.user)
            await client.chat_postMessage(channel=opened["channel"]["id"], **to_message(reply))
        except Exception:  # noqa: BLE001
            logger.exception("saving a budget from the modal failed")

    spawn(save())
