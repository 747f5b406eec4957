"""Events API subscriptions."""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.chat.slack.events.app_home_opened import app_home_opened_callback


def register(app: AsyncApp) -> None:
    app.event("app_home_opened")(app_home_opened_callback)
