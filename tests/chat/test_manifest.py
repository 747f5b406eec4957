"""manifest.yml declares what the bot uses: /tune, the scopes, interactivity, App Home, Socket Mode."""

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
