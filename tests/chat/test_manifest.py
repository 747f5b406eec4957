"""manifest.yml declares what the bot uses: /tune, the shortcuts, the scopes, interactivity, App Home, Socket
Mode; and every listener the app registers is declared (a shortcut or event missing from the manifest never
arrives)."""

from __future__ import annotations

from pathlib import Path

import yaml

MANIFEST = Path(__file__).resolve().parents[2] / "manifest.yml"


def test_manifest_has_command_scopes_and_settings() -> None:
    m = yaml.safe_load(MANIFEST.read_text())
    (command,) = m["features"]["slash_commands"]
    assert command["command"] == "/tune" and "estimate" in command["usage_hint"]
    assert set(m["oauth_config"]["scopes"]["bot"]) == {
        "commands",
        "chat:write",
        "chat:write.public",
        "files:read",
        "files:write",
        "im:write",
        "users:read",
    }
    assert m["features"]["app_home"]["home_tab_enabled"] is True
    assert m["settings"]["interactivity"]["is_enabled"] is True
    assert m["settings"]["socket_mode_enabled"] is True
    assert m["settings"]["event_subscriptions"]["bot_events"] == ["app_home_opened"]


def test_manifest_declares_the_shortcuts_the_app_listens_to() -> None:
    from bot.chat.slack.shortcuts import LAUNCH_FROM_FILE, LAUNCH_SHORTCUT

    m = yaml.safe_load(MANIFEST.read_text())
    shortcuts = {s["callback_id"]: s for s in m["features"]["shortcuts"]}
    assert shortcuts[LAUNCH_SHORTCUT]["type"] == "global"
    assert shortcuts[LAUNCH_FROM_FILE]["type"] == "message"
    for s in shortcuts.values():  # Slack's limits: name 24, description 150
        assert len(s["name"]) <= 24 and len(s["description"]) <= 150
    # the launch form needs: commands (shortcuts), files:read (the message's JSONL), im:write (the DM thread)
    assert {"commands", "files:read", "im:write"} <= set(m["oauth_config"]["scopes"]["bot"])
