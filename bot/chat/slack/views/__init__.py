"""Modal submissions (view_submission)."""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.chat.blockkit import BUDGET_MODAL
from bot.chat.launch_form import LAUNCH_FORM
from bot.chat.slack.views.budget_modal import budget_modal_callback
from bot.chat.slack.views.launch_form import launch_form_callback


def register(app: AsyncApp) -> None:
    app.view(BUDGET_MODAL)(budget_modal_callback)
    app.view(LAUNCH_FORM)(launch_form_callback)
