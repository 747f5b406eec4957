"""The buttons that hand one engine call to the chat layer: ack at once, the call and its reply after.

Each button differs only in which Chat method it calls, what the action id adds (the launch choice,
the volume verb) and whether the reply replaces the card it was clicked on, so they are one listener
shape and a table. Launch: the estimate id in the button, one job per estimate however many clicks.
Approve / Reject: admins only, never one's own job; the request card is replaced by the outcome, a
refusal goes to the clicker only. Stop: the owner or an admin; the card itself is updated by the
notifier on the stopped event, the clicker gets a line. Resume (a stopped or failed job's card): the same
rules as `/tune resume JOB`. Delete / Keep on an idle-volume reminder.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.replies import Reply
from bot.chat.slack.common import actor_of, after_ack, chat_of, dm_responder

Listener = Callable[..., Awaitable[None]]


def _public(reply: Reply) -> bool:
    return reply.public


def button(
    method: str,
    what: str,
    *,
    id_prefix: str | None = None,
    replace: Callable[[Reply], bool] | bool = False,
    slow: bool = False,
) -> Listener:
    """A block_actions listener calling ``chat.<method>(value[, action id minus id_prefix], actor)``
    (``slow``: on the chat's pool for slow work, see bot/chat/slowwork.py)."""

    async def listener(
        ack: AsyncAck,
        body: dict[str, Any],
        action: dict[str, Any],
        respond: AsyncRespond,
        context: Any,
        logger: Logger,
        client: AsyncWebClient,
    ) -> None:
        await ack()
        args = [action.get("value", "")]
        if id_prefix is not None:
            args.append(action["action_id"].removeprefix(id_prefix))
        chat = chat_of(context)
        call = getattr(chat, method)
        actor = actor_of(body)
        if not body.get("response_url"):  # clicked in App Home: no message to answer
            respond = dm_responder(client, actor.user, home=context.get("home"))  # type: ignore[assignment]
        after_ack(
            call,
            *args,
            actor,
            respond=respond,
            logger=logger,
            what=what,
            replace=replace,
            names=chat.names,
            slow=chat.slow if slow else None,
            user=actor.user,
        )

    listener.__name__ = f"{method}_button"
    return listener


BUTTONS: dict[str | re.Pattern[str], Listener] = {
    re.compile(r"^launch_(cheapest|safest|fastest|sweep)$"): button(
        "launch",
        "launch",
        id_prefix="launch_",
        replace=True,
        slow=True,  # stages and checks the dataset
    ),
    "cancel_estimate": button("cancel_estimate", "cancel", replace=True),
    "approve_job": button("approve", "approve", replace=lambda reply: reply.kind == "success"),
    "reject_job": button("reject", "reject", replace=_public),
    "stop_job": button("stop", "stop"),
    "resume_job": button("resume", "resume"),
    re.compile(r"^volume_(delete|keep)$"): button(
        "volume_action", "volume action", id_prefix="volume_", replace=_public
    ),
}
