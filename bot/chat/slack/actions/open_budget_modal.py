"""App Home's "Set a budget" button opens the modal (trigger ids expire in 3 s: open it at once)."""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.blockkit import budget_modal


async def open_budget_modal_callback(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, logger: Logger
) -> None:
    await ack()
    try:
        await client.views_open(trigger_id=body["trigger_id"], view=budget_modal())
    except Exception:  # noqa: BLE001
        logger.exception("could not open the budget modal")
