"""docs/slack-setup.md works as written: with the settings its steps export, every `/tune` line of its
"Try it" section gets an answer, not a refusal (the guide's s3:// dataset was refused before it set
TUNEBOT_CHAT_STORAGE_PREFIXES)."""

from __future__ import annotations

import re
from pathlib import Path

from bot.chat.handlers import Actor, ChatHandlers
from bot.planner.sources import SourcePolicy
from bot.settings import Settings

from .fake_engine import FakeEngine

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "slack-setup.md"
PLACEHOLDER = re.compile(r"\.\.\.|YOUR-HOST")


def exported(text: str) -> dict[str, str]:
    """The variables the guide's Socket Mode step exports (placeholder values left out)."""
    step = text.split("## 2a.", 1)[1].split("## 2b.", 1)[0]
    found: dict[str, str] = {}
    for line in re.findall(r"^\s*export (.+)$", step, flags=re.M):
        for name, value in re.findall(r"(\w+)=(\S+)", line.split("#", 1)[0]):
            if not PLACEHOLDER.search(value):
                found[name] = value
    return found


def tried(text: str) -> list[str]:
    block = text.split("## 4. Try it", 1)[1].split("```", 2)[1]
    return [line.strip().removeprefix("/tune ") for line in block.splitlines() if line.startswith("/tune")]


def test_every_try_it_line_is_answered_with_the_guides_settings(tmp_path: Path) -> None:
    text = GUIDE.read_text()
    env = exported(text)
    assert env == {"TUNEBOT_CHAT_STORAGE_PREFIXES": "s3://bucket/"}
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path), **env)
    chat = ChatHandlers(FakeEngine(), sources=SourcePolicy.from_settings(settings))
    lines = tried(text)
    assert any("dataset=s3://bucket/train.jsonl" in line for line in lines)
    for line in lines:
        if line == "launch":  # Slack opens the launch form for it (tests/chat/test_launch_form.py)
            continue
        reply = chat.handle_text(line, Actor("UALICE0001", "C1"))
        assert reply.kind != "error", (line, reply.text())
    # without the guide's prefix setting, its own example is refused
    bare = ChatHandlers(
        FakeEngine(), sources=SourcePolicy.from_settings(Settings(TUNEBOT_DATA_DIR=str(tmp_path)))
    )
    refused = bare.handle_text(next(x for x in lines if "s3://" in x), Actor("UALICE0001", "C1"))
    assert refused.kind == "error"
