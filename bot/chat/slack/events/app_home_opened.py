"""App Home (the team's dashboard, chat/dashboard.py), published on every open."""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.blockkit import to_home_view
from bot.chat.slack.common import chat_of, in_thread, spawn


async def app_home_opened_callback(
    event: dict[str, Any], client: AsyncWebClient, context: Any, logger: Logger
) -> None:
    if event.get("tab", "home") != "home":
        return
    user = event.get("user", "")
    chat = chat_of(context)
    if context.get("home") is not None:
        context["home"].opened(user)  # from now on it is refreshed when a job changes state

    async def publish() -> None:
        try:
            view = await in_thread(lambda: to_home_view(chat.home(user), names=chat.names))
            await client.views_publish(user_id=user, view=view)
        except Exception:  # noqa: BLE001
            logger.exception("could not publish the App Home of %s", user)

    spawn(publish())  # the event is acknowledged now; Slack retries deliveries slower than 3 s
