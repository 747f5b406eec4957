"""scripts/blockkit_preview.py (the screens of the closing note) renders what the bot sends: people by name,
table blocks as tables, buttons."""

from __future__ import annotations

from bot.chat import cards
from bot.chat.blockkit import to_message
from scripts.blockkit_preview import blocks_html

from .fake_engine import make_estimate


def test_preview_shows_names_tables_and_buttons() -> None:
    blocks = to_message(cards.estimate_reply(make_estimate(), estimate_id="e1", launching=True))["blocks"]
    blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "owner <@UALICE0001> *bold*"}})
    page = blocks_html(blocks, {"UALICE0001": "alice"}.get)
    assert "<table>" in page and "text-align:right" in page and 'class="btn primary"' in page
    assert '<span class="mention">@alice</span>' in page and "<b>bold</b>" in page
