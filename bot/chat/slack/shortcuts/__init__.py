"""Shortcuts: the global "Launch a fine-tune" and the message shortcut on an uploaded JSONL."""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.chat.slack.shortcuts.launch_form import (
    LAUNCH_FROM_FILE,
    LAUNCH_SHORTCUT,
    launch_from_file_callback,
    launch_shortcut_callback,
)


def register(app: AsyncApp) -> None:
    app.shortcut(LAUNCH_SHORTCUT)(launch_shortcut_callback)
    app.shortcut(LAUNCH_FROM_FILE)(launch_from_file_callback)
