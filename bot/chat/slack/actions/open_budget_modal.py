"""App Home's "Set a budget" button opens the modal (trigger ids expire in 3 s: open it at once).

Only for whoever may set budgets (the policy's can_set_budget: App Home shows the button to them alone); a
click from anyone else (a forged payload) opens nothing and gets the refusal by DM, naming who sets budgets.
"""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.blockkit import budget_modal
from bot.chat.slack.common import actor_of, chat_of, dm_responder, send, spawn


async def open_budget_modal_callback(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: Any, logger: Logger
) -> None:
    await ack()
    actor = actor_of(body)
    refusal = chat_of(context).budget_modal_refusal(actor)  # the policy alone: no I/O, well within 3 s
    if refusal is not None:

        async def refuse() -> None:
            try:
                await send(dm_responder(client, actor.user), refusal)
            except Exception:  # noqa: BLE001
                logger.exception("could not tell %s that budgets are not theirs to set", actor.user)

        spawn(refuse())
        return
    try:
        await client.views_open(trigger_id=body["trigger_id"], view=budget_modal())
    except Exception:  # noqa: BLE001
        logger.exception("could not open the budget modal")
