"""Button clicks (block_actions)."""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.chat.slack.actions.buttons import BUTTONS
from bot.chat.slack.actions.open_budget_modal import open_budget_modal_callback
from bot.chat.slack.actions.open_launch_modal import open_launch_modal_callback


def register(app: AsyncApp) -> None:
    for action_id, listener in BUTTONS.items():
        app.action(action_id)(listener)
    app.action("open_budget_modal")(open_budget_modal_callback)
    app.action("open_launch_modal")(open_launch_modal_callback)
