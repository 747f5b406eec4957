"""Button clicks (block_actions)."""

from __future__ import annotations

import re

from slack_bolt.async_app import AsyncApp

from bot.chat.slack.actions.approve import approve_callback, reject_callback
from bot.chat.slack.actions.cancel import cancel_callback
from bot.chat.slack.actions.launch import launch_callback
from bot.chat.slack.actions.open_budget_modal import open_budget_modal_callback
from bot.chat.slack.actions.stop import stop_callback
from bot.chat.slack.actions.volume import volume_callback


def register(app: AsyncApp) -> None:
    app.action(re.compile(r"^launch_(cheapest|safest|fastest)$"))(launch_callback)
    app.action("cancel_estimate")(cancel_callback)
    app.action("approve_job")(approve_callback)
    app.action("reject_job")(reject_callback)
    app.action("stop_job")(stop_callback)
    app.action(re.compile(r"^volume_(delete|keep)$"))(volume_callback)
    app.action("open_budget_modal")(open_budget_modal_callback)
