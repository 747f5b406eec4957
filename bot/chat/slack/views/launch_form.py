"""The launch form (chat/launch_form.py) in Slack: opened by `/tune launch`, the shortcuts and App Home;
each submission either estimates (the modal is updated in place with the offers) or launches the offer
picked. Field errors come back in the ack; slow work (the estimate, the launch) runs after it and ends in
a views.update of the same modal.
"""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.handlers import Actor, ChatHandlers
from bot.chat.launch_form import (
    CHANNEL,
    OFFER,
    FormState,
    fingerprint,
    form_view,
    message_view,
    parse_form,
    read_values,
)
from bot.chat.replies import error_reply
from bot.chat.slack.common import actor_of, chat_of, spawn
from bot.chat.slowwork import SlowWorkRefused
from bot.planner.request import EstimateRequest


async def open_launch_form(
    client: AsyncWebClient,
    trigger_id: str,
    *,
    channel: str | None,
    values: dict[str, str] | None = None,
    status: str | None = None,
) -> None:
    """Open the form (within 3 s of the trigger); without a channel it asks where the thread goes."""
    view = form_view(values, state=FormState(channel=channel), ask_channel=channel is None, status=status)
    await client.views_open(trigger_id=trigger_id, view=view)


def _asks_channel(view: dict[str, Any]) -> bool:
    return any(b.get("block_id") == CHANNEL for b in view.get("blocks") or [])


async def launch_form_callback(
    ack: AsyncAck,
    body: dict[str, Any],
    view: dict[str, Any],
    client: AsyncWebClient,
    context: Any,
    logger: Logger,
) -> None:
    chat = chat_of(context)
    who = actor_of(body)  # the signed payload's user and workspace (team budgets)
    user = who.user
    values = read_values(view)
    state = FormState.loads(view.get("private_metadata"))
    request, errors = parse_form(values)
    if errors or request is None:
        await ack(response_action="errors", errors=errors)
        return
    current = fingerprint(values)
    view_id = str(view.get("id"))
    if state.estimate_id and state.fingerprint == current and values.get(OFFER):
        await ack(response_action="update", view=message_view("Launching", ":hourglass: Launching…"))
        spawn(_launch(chat, client, logger, view_id, user, state, values, team=who.team))
        return
    asks = _asks_channel(view)
    estimating = form_view(
        values,
        state=FormState(channel=state.channel),
        ask_channel=asks,
        status=":hourglass: Estimating… the offers appear here in a few seconds.",
    )
    await ack(response_action="update", view=estimating)
    spawn(_estimate(chat, client, logger, view_id, user, state, values, request, asks))


async def _estimate(
    chat: ChatHandlers,
    client: AsyncWebClient,
    logger: Logger,
    view_id: str,
    user: str,
    state: FormState,
    values: dict[str, str],
    request: EstimateRequest,
    asks: bool,
) -> None:
    try:
        actor = Actor(user, values.get(CHANNEL) or state.channel)
        try:  # on the slow pool (bot/chat/slowwork.py), like /tune estimate
            estimate_id, estimate, reply = await chat.slow.call(chat.form_estimate, request, actor, user=user)
        except SlowWorkRefused as exc:
            estimate_id, estimate, reply = None, None, error_reply(str(exc))
        if estimate is None:
            view = form_view(
                values, state=FormState(channel=state.channel), ask_channel=asks, status=reply.text()[:2000]
            )
        else:
            done = FormState(channel=state.channel, estimate_id=estimate_id, fingerprint=fingerprint(values))
            view = form_view(
                values,
                state=done,
                ask_channel=asks,
                estimate=estimate,
                status="Pick an offer and press *Launch* (change a field to estimate again).",
            )
        await client.views_update(view_id=view_id, view=view)
    except Exception:  # noqa: BLE001 - the form says so; the log has the details
        logger.exception("the launch form's estimate failed")
        await client.views_update(view_id=view_id, view=message_view("Not estimated", _sorry()))


async def _launch(
    chat: ChatHandlers,
    client: AsyncWebClient,
    logger: Logger,
    view_id: str,
    user: str,
    state: FormState,
    values: dict[str, str],
    *,
    team: str | None = None,
) -> None:
    try:
        channel = values.get(CHANNEL) or state.channel
        if not channel:  # a global shortcut or App Home, no channel picked: the owner's DM with the bot
            opened = await client.conversations_open(users=user)
            channel = opened["channel"]["id"]
        actor = Actor(user, channel, team=team)
        offer = values.get(OFFER, "")
        reply = await chat.slow.run(chat.launch, state.estimate_id or "", offer, actor, user=user)
        title = "Launched" if reply.kind in ("success", "warning") else "Not launched"
        where = f"\nThe job's thread is in <#{channel}>." if reply.kind == "success" else ""
        await client.views_update(view_id=view_id, view=message_view(title, reply.text() + where))
    except Exception:  # noqa: BLE001
        logger.exception("the launch form's launch failed")
        await client.views_update(view_id=view_id, view=message_view("Not launched", _sorry()))


def _sorry() -> str:
    from bot.chat.handlers import GENERIC_ERROR

    return f":warning: {GENERIC_ERROR}"
