"""Slash commands."""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.chat.slack.commands.tune import tune_callback


def register(app: AsyncApp) -> None:
    app.command("/tune")(tune_callback)
