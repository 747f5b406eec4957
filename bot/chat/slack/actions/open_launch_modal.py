"""App Home's "Launch a fine-tune" button opens the launch form (trigger ids expire in 3 s: at once)."""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.slack.views.launch_form import open_launch_form


async def open_launch_modal_callback(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, logger: Logger
) -> None:
    await ack()
    try:
        await open_launch_form(client, body["trigger_id"], channel=None)
    except Exception:  # noqa: BLE001
        logger.exception("could not open the launch form")
